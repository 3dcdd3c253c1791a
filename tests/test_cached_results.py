"""A cached stage result is trusted only while the files it points to are on disk and unchanged."""

from __future__ import annotations

from pathlib import Path

from grpo_pipeline.tasks.core.common import Checkpoint, DatasetRefs, Ref, damaged, fingerprint_path


def test_intact_results_have_no_damage(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "train.parquet"
    data.write_bytes(b"rows")
    refs = DatasetRefs(
        train=Ref(path=str(data), fingerprint=fingerprint_path(data)),
        eval=Ref(path=str(data), fingerprint=fingerprint_path(data)),
    )
    ckpt = Checkpoint(path=str(model), fingerprint=fingerprint_path(model), run_id="r")
    assert damaged(refs) == [] and damaged(ckpt) == [] and damaged([ckpt, None, "text"]) == []
    assert damaged(Checkpoint(path="org/model", fingerprint="hub:org/model")) == []  # a hub model has no files here


def test_missing_and_changed_files_are_named(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    ckpt = Checkpoint(path=str(model), fingerprint=fingerprint_path(model))
    (model / "config.json").write_text('{"edited": true}')
    (problem,) = damaged(ckpt)
    assert str(model) in problem and "changed" in problem
    gone = Ref(path=str(tmp_path / "gone.parquet"), fingerprint="0" * 64)
    refs = DatasetRefs(train=gone, eval=gone)
    assert damaged(refs) == [f"{gone.path} is missing"] * 2


def test_an_eval_result_checks_its_items_file(tmp_path: Path) -> None:
    from grpo_pipeline.configs.schema import EvalConfig
    from grpo_pipeline.tasks.scoring.results import summarize

    data = tmp_path / "eval.parquet"
    data.write_bytes(b"rows")
    items = [{"greedy_correct": 1, "correct_count": 1, "pass_at_k": {"1": 1.0}, "maj_at_k": {}, "reward_means": {}}]
    path = tmp_path / "items.jsonl"
    path.write_text("{}\n")
    result = summarize(items, EvalConfig(n_samples=1, k=[1]), "m", 0, Ref(path=str(data), fingerprint="x"), path)
    path.unlink()
    assert f"{path} is missing" in damaged(result)
