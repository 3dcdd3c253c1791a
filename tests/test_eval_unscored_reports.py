"""The run summary and the model card say over how many items each score was computed and why completions were
left unscored."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_pipeline.configs.schema import EvalConfig, PipelineConfig, RegistryConfig
from grpo_pipeline.flows.summary import Round, Summary
from grpo_pipeline.flows.summary_tables import as_markdown, score_table
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.release.card import model_card
from grpo_pipeline.tasks.release.gate import GateDecision
from grpo_pipeline.tasks.scoring.items import item_id
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult, summarize

EVAL = EvalConfig(n_samples=2, k=[1, 2])
REASON = "sandbox error: could not start the program"


def result(tmp_path: Path, name: str, greedy: list[int | None]) -> EvalResult:
    items = []
    for i, ok in enumerate(greedy):
        samples = [ok, ok]
        items.append(
            {
                "id": item_id(f"{i}+{i}="),
                "prompt": f"{i}+{i}=",
                "answer": str(2 * i),
                "greedy": "x",
                "greedy_correct": ok,
                "samples": ["x", "x"],
                "sample_correct": samples,
                "correct_count": int(ok or 0) * 2,
                "scored_count": 0 if ok is None else 2,
                "pass_at_k": {"1": None if ok is None else float(ok), "2": None if ok is None else float(ok)},
                "maj_at_k": {"1": ok, "2": ok},
                "sample_rewards": {},
                "reward_means": {},
                "unscored_reason": REASON if ok is None else None,
            }
        )
    path = tmp_path / name / ITEMS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return summarize(items, EVAL, name, 0, Ref(path="eval.parquet", fingerprint="f" * 64), path)


def test_the_summary_shows_denominators_and_the_reason(tmp_path):
    baseline = result(tmp_path, "sft", [1, 0, 0, 1])
    round1 = result(tmp_path, "r1", [1, None, 1, 1])
    assert round1.accuracy == 1.0 and round1.unscored["accuracy"] == 1
    policy = Checkpoint(path=str(tmp_path), fingerprint="c" * 64, stage="grpo-round1")
    summary = Summary.build(PipelineConfig(), [], baseline, [Round(index=1, policy=policy, result=round1)])
    text = as_markdown(summary)
    assert "1.000 [1.000, 1.000] (over 3 of 4)" in text
    assert "- grpo round 1: unscored: 3 of 12 completions" in text and REASON in text
    assert "sft: unscored" not in text
    table = score_table(summary)
    assert table[1]["unscored/accuracy"] == 1 and table[0]["unscored/accuracy"] == 0


def test_the_model_card_shows_items_scored_and_the_reason(tmp_path):
    scores = result(tmp_path, "r1", [1, None, 0, 1])
    gate = GateDecision(metric="accuracy", promote=True, reason="first version", challenger=0.5, n=3, min_delta=0)
    policy = Checkpoint(path=str(tmp_path), fingerprint="c" * 64, stage="grpo-round1")
    card = model_card(RegistryConfig(), policy, scores, None, gate, {}, "name: x\n", "1+1=")
    assert "| accuracy | 0.667" in card and "| 3/4 |" in card
    assert "unscored: 3 of 12 completions" in card and REASON in card
    assert f"`{scores.scorer_version}`" in card
    clean = result(tmp_path, "r2", [1, 0, 0, 1])
    card = model_card(RegistryConfig(), policy, clean, None, gate, {}, "name: x\n", "1+1=")
    assert "Every completion was scored by the correctness reward `correctness`" in card and "| 4/4 |" in card


def test_the_rounds_table_leaves_unscored_items_out_of_its_counts_and_changes(tmp_path):
    """An item the current model left unscored counts in neither its n nor the paired change, which is taken over the
    items both models scored; before, the change read `+nan [nan, nan]` and n counted the unscored item."""
    baseline = result(tmp_path, "sft", [1, 0, 0, 1])
    round1 = result(tmp_path, "r1", [1, None, 1, 1])
    round2 = result(tmp_path, "r2", [None, 1, 1, 1])
    policy = Checkpoint(path=str(tmp_path), fingerprint="c" * 64, stage="grpo-round1")
    rounds = [Round(index=i, policy=policy, result=r) for i, r in ((1, round1), (2, round2))]
    summary = Summary.build(PipelineConfig(), [], baseline, rounds)
    sft, first, second = summary.rounds
    assert (sft.n, first.n, second.n) == (4, 3, 3) and first.items == 4
    assert first.value == 1.0 and first.change == 1 / 3  # items 0, 2, 3: 1->1, 0->1, 1->1
    assert second.change == 0.0 and second.change_ci == (0.0, 0.0)  # items 2, 3: scored by both rounds, 1->1
    text = as_markdown(summary)
    assert "nan" not in text
    assert "over the same 4 items, those both models scored):" in text
    assert "| grpo round 1 | 1.000 (over 3 of 4) | +0.333 [" in text
