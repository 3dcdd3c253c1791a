"""Registration: real MLflow transformers models, lineage tags, the statistical gate, never twice, all or nothing.

Policies are real (tiny, untrained) Hugging Face checkpoints; their eval results are built from per-item scores
through `scoring.results.summarize`, so the gate sees exactly what the pipeline writes. A SQLite store stands in for
the tracking server, except in the last test, which starts a real one.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from grpo_pipeline.configs.schema import EvalConfig, RegistryConfig, RewardSpec, TinyModelConfig
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, fingerprint_path
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import configure_mlflow
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.release.card import DESCRIPTION_LIMIT, version_description
from grpo_pipeline.tasks.scoring.evaluation import evaluate_model
from grpo_pipeline.tasks.scoring.items import item_id
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult, summarize
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

EVAL = EvalConfig(n_samples=2, k=[1, 2], max_new_tokens=3, batch_size=64)
TINY = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=32)


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return tmp_path


def eval_set(run_dir: Path, n: int, name: str = "eval") -> Ref:
    """`n` addition problems as a Parquet eval split."""
    rows = pd.DataFrame({"prompt": [f"{i}+{i}=" for i in range(n)], "answer": [str(2 * i) for i in range(n)]})
    path = run_dir / f"{name}.parquet"
    rows.to_parquet(path, index=False)
    return Ref(path=str(path), fingerprint=fingerprint_path(path))


def policy(run_dir: Path, name: str, seed: int = 0) -> Checkpoint:
    """A real tiny checkpoint and the MLflow run that 'trained' it."""
    path = build_tiny_model(TINY, run_dir / name, seed)
    configure_mlflow(run_dir, "test")
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_metric("reward", 0.5)
    return Checkpoint(path=str(path), fingerprint=fingerprint_path(path), run_id=run.info.run_id, stage="grpo-round1")


def scored(run_dir: Path, held_out: Ref, correct: list[int], name: str) -> EvalResult:
    """An EvalResult whose items have the given greedy correctness (1/0 per item)."""
    rows = pd.read_parquet(held_out.path)
    items = [
        {
            "id": item_id(p),
            "prompt": p,
            "answer": a,
            "greedy": a if ok else "x",
            "greedy_correct": ok,
            "samples": [a, "x"],
            "sample_correct": [ok, 0],
            "correct_count": ok,
            "pass_at_k": {"1": ok / 2, "2": float(ok)},
            "maj_at_k": {"1": ok, "2": ok},
            "sample_rewards": {},
            "reward_means": {},
        }
        for p, a, ok in zip(rows["prompt"], rows["answer"], correct, strict=True)
    ]
    path = run_dir / f"items-{name}" / ITEMS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return summarize(items, EVAL, name, 0, held_out, path)


def register(run_dir: Path, name: str, correct: list[int], held_out: Ref, seed: int = 0, **cfg) -> object:
    config = RegistryConfig(experiment="test", model_name="m", **cfg)
    ctx = RunContext(run_dir=str(run_dir), experiment="test", recipe="test", seed=0)
    ckpt = policy(run_dir, name, seed)
    result = scored(run_dir, held_out, correct, name)
    return register_policy(ckpt, result, None, config, ctx, "name: test\n", {"config_hash": "abc", "round": "1"})


def aliases(version: str) -> list[str]:
    return list(MlflowClient().get_model_version("m", version).aliases)


def flip(correct: list[int], fraction: float, to: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [to if rng.random() < fraction else c for c in correct]


def test_first_version_is_a_loadable_mlflow_model_with_card_and_lineage(tracking):
    held_out = eval_set(tracking, 40)
    first = register(tracking, "a", [1] * 20 + [0] * 20, held_out)
    assert (first.version, first.alias, first.gate.decision) == ("1", "champion", "first")

    generator = mlflow.transformers.load_model("models:/m@champion")
    out = generator("1+1=", max_new_tokens=3, do_sample=False)
    assert isinstance(out[0]["generated_text"], str) and out[0]["generated_text"].startswith("1+1=")
    predicted = mlflow.pyfunc.load_model("models:/m@champion").predict(["1+1=", "2+2="])
    assert len(predicted) == 2 and all(isinstance(p, str) for p in predicted)

    version = MlflowClient().get_model_version("m", "1")
    assert "## Promotion gate" in version.description and "mlflow.transformers.load_model" in version.description
    local = Path(mlflow.artifacts.download_artifacts("models:/m/1", dst_path=str(tracking / "dl")))
    card = (local / "README.md").read_text()  # the whole card; the version's description is it without the config
    assert (
        (local / "MLmodel").exists()
        and "## Resolved config" in card
        and version.description == version_description(card)
    )
    assert len(version.description) <= DESCRIPTION_LIMIT and "## Resolved config" not in version.description
    tags = version.tags
    for tag in ("code_version", "torch_version", "transformers_version", "trl_version", "config_hash"):
        assert tags[tag], tag
    assert tags["eval_fingerprint"] == held_out.fingerprint and tags["eval_n_samples"] == "2"
    assert tags["gate.decision"] == "first" and tags["gate.n"] == "40"
    # the experiment opens in MLflow's model-training view, not the GenAI one
    assert MlflowClient().get_experiment_by_name("test").tags["mlflow.experimentKind"] == "custom_model_development"


def test_degraded_challenger_never_takes_champion(tracking):
    held_out = eval_set(tracking, 200)
    good = flip([1] * 200, 0.2, 0, seed=1)
    register(tracking, "a", good, held_out)
    worse = register(tracking, "b", flip(good, 0.15, 0, seed=2), held_out, seed=1)
    assert (worse.alias, worse.gate.decision, worse.gate.champion_version) == ("challenger", "kept champion", "1")
    assert worse.gate.ci_high < 0
    assert aliases("1") == ["champion"] and aliases("2") == ["challenger"]


EXACT_REWARD = """
def exact(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == str(a).strip() else 0.0 for c, a in zip(completions, answer)]
"""


def test_degraded_checkpoint_is_evaluated_for_real_and_stays_challenger(tracking, monkeypatch):
    """The champion is right on every item by construction (the references are its own greedy outputs, judged by
    exact match); a copy with noised weights is really evaluated on the same items, and the alias does not move."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.tasks.scoring.generation import generate
    from grpo_pipeline.tasks.training.trainer import load_tokenizer

    (tracking / "exact_reward.py").write_text(EXACT_REWARD)
    monkeypatch.syspath_prepend(str(tracking))
    champion = policy(tracking, "champion")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(champion.path), load_tokenizer(champion.path)
    tokenizer.padding_side = "left"
    prompts = [f"{i}+{2 * i}=" for i in range(60)]
    answers = [g[0] for g in generate(model, tokenizer, prompts, max_new_tokens=3, batch_size=64)]
    path = tracking / "eval.parquet"
    pd.DataFrame({"prompt": prompts, "answer": answers}).to_parquet(path, index=False)
    held_out = Ref(path=str(path), fingerprint=fingerprint_path(path))
    cfg = EVAL.model_copy(update={"correctness_reward": RewardSpec(name="exact_reward:exact")})
    ctx = RunContext(run_dir=str(tracking), experiment="test", recipe="test", seed=0)
    registry = RegistryConfig(experiment="test", model_name="m")

    def register_real(ckpt: Checkpoint, label: str):
        result = evaluate_model(ckpt.path, held_out, cfg, seed=0, out=tracking / f"eval-{label}", label=label)
        return result, register_policy(ckpt, result, None, registry, ctx, "name: test\n", {})

    first_result, first = register_real(champion, "champion")
    assert first_result.accuracy == 1.0 and first.alias == "champion"
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():  # degrade: large noise on the attention and MLP weights
        for name, p in model.named_parameters():
            if "embed" not in name and "norm" not in name:
                p.add_(torch.randn(p.shape, generator=noise) * 5)
    model.save_pretrained(tracking / "degraded")
    tokenizer.save_pretrained(tracking / "degraded")
    configure_mlflow(tracking, "test")
    with mlflow.start_run(run_name="degraded") as run:
        pass
    degraded = Checkpoint(
        path=str(tracking / "degraded"), fingerprint=fingerprint_path(tracking / "degraded"), run_id=run.info.run_id
    )
    worse_result, worse = register_real(degraded, "degraded")
    assert worse_result.accuracy < 0.8
    assert (worse.alias, worse.gate.decision, worse.gate.champion_version) == ("challenger", "kept champion", "1")
    assert str(MlflowClient().get_model_version_by_alias("m", "champion").version) == "1"


def test_promotion_needs_the_ci_above_min_delta(tracking):
    held_out = eval_set(tracking, 300)
    base = flip([0] * 300, 0.5, 1, seed=3)
    register(tracking, "a", base, held_out)
    # +2 points on 300 items, with as many items broken as fixed around them: inside the noise
    noisy = list(base)
    ones, zeros = [i for i, c in enumerate(base) if c], [i for i, c in enumerate(base) if not c]
    for i in zeros[:16]:
        noisy[i] = 1
    for i in ones[:10]:
        noisy[i] = 0
    tie = register(tracking, "b", noisy, held_out, seed=1)
    assert tie.alias == "challenger" and tie.gate.delta == pytest.approx(6 / 300)
    assert tie.gate.ci_low < 0 < tie.gate.ci_high
    # +20 points, only fixes: promoted, unless the margin asks for more than the CI's lower bound
    better = list(base)
    for i in zeros[:60]:
        better[i] = 1
    strict = register(tracking, "c", better, held_out, seed=2, min_delta=0.5)
    assert strict.alias == "challenger" and strict.gate.ci_low > 0.1
    promoted = register(tracking, "d", better, held_out, seed=3)
    assert (promoted.alias, promoted.gate.decision) == ("champion", "promoted")
    assert aliases(promoted.version) == ["champion"]


def test_a_run_is_never_registered_twice(tracking):
    held_out = eval_set(tracking, 20)
    config = RegistryConfig(experiment="test", model_name="m")
    ctx = RunContext(run_dir=str(tracking), experiment="test", recipe="test", seed=0)
    ckpt = policy(tracking, "a")
    result = scored(tracking, held_out, [1] * 20, "a")
    first = register_policy(ckpt, result, None, config, ctx, "name: test\n", {})
    again = register_policy(ckpt, result, None, config, ctx, "name: test\n", {})
    assert (again.version, again.alias, again.existing) == (first.version, "champion", True)
    assert again.gate == first.gate
    assert len(MlflowClient().search_model_versions("name='m'")) == 1


def test_champion_scored_on_another_eval_set_is_rescored_on_this_one(tracking):
    old_set, new_set = eval_set(tracking, 10, "old"), eval_set(tracking, 12, "new")
    register(tracking, "a", [1] * 10, old_set)
    challenger = register(tracking, "b", [0] * 12, new_set, seed=1)
    # The champion's logged scores (all correct on the old set) were not used: it was evaluated on the new set.
    truth = evaluate_model(str(tracking / "a"), new_set, EVAL, seed=0, out=tracking / "check")
    assert challenger.gate.champion == pytest.approx(truth.accuracy)
    assert challenger.gate.n == 12
    assert any((tracking / "champion").rglob(ITEMS_FILE))


def test_bad_gating_metric_touches_nothing(tracking):
    held_out = eval_set(tracking, 10)
    with pytest.raises(ValueError, match="gating_metric"):
        register(tracking, "a", [1] * 10, held_out, gating_metric="f1")
    assert MlflowClient().search_registered_models() == []


def test_failed_aliasing_leaves_no_version(tracking, monkeypatch):
    held_out = eval_set(tracking, 10)
    register(tracking, "a", [0] * 10, held_out)

    def broken(*args, **kwargs):
        raise RuntimeError("registry went away")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", broken)
    with pytest.raises(RuntimeError, match="went away"):
        register(tracking, "b", [1] * 10, held_out, seed=1)
    versions = MlflowClient().search_model_versions("name='m'")
    assert [str(v.version) for v in versions] == ["1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_registration_through_a_real_mlflow_server(tmp_path, monkeypatch):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "art")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited"
                assert time.time() < deadline, "mlflow server did not start"
                time.sleep(1)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        held_out = eval_set(tmp_path, 100)
        first = register(tmp_path / "run", "a", [0] * 100, held_out)
        second = register(tmp_path / "run", "b", [1] * 100, held_out, seed=1)
        assert (first.alias, second.alias, second.gate.champion_version) == ("champion", "champion", "1")
        client = MlflowClient(tracking_uri=url)
        assert str(client.get_model_version_by_alias("m", "champion").version) == "2"
        predicted = mlflow.pyfunc.load_model("models:/m@champion").predict(["3+4="])
        assert len(predicted) == 1 and isinstance(predicted[0], str)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def test_every_gating_metric_has_per_item_scores(tracking):
    from grpo_pipeline.tasks.release.gate import item_metric

    held_out = eval_set(tracking, 4)
    items = scored(tracking, held_out, [1, 0, 1, 1], "x").items()
    assert item_metric(items, "accuracy").tolist() == [1, 0, 1, 1]
    assert item_metric(items, "pass_at_1").tolist() == [0.5, 0, 0.5, 0.5]
    assert item_metric(items, "maj_at_2").tolist() == [1, 0, 1, 1]
    assert list(item_metric(items, "accuracy").index) == items["id"].tolist()
    with pytest.raises(ValueError, match="not an eval metric name"):
        item_metric(items, "f1")


def test_a_version_description_fits_mlflows_column_whatever_the_card():
    """MLflow stores a version's description in a VARCHAR(5000), which PostgreSQL enforces: the registration of a
    real recipe's card (its resolved config alone is ~6,000 characters) failed there. The description keeps the card
    up to its resolved config, and is cut at a line where even that is too long."""
    card = "# m\n\n## Promotion gate\n**promoted**.\n\n## Resolved config\n```yaml\n" + "key: value\n" * 900 + "```\n"
    short = version_description(card)
    assert len(card) > DESCRIPTION_LIMIT >= len(short)
    assert "**promoted**" in short and "key: value" not in short and "README.md of the logged model" in short
    notes = "# m\n\n## Training notes\n" + "".join(f"- note {i}\n" for i in range(1000)) + "## Resolved config\nx\n"
    cut = version_description(notes)
    assert len(cut) <= DESCRIPTION_LIMIT and "- note 0\n" in cut and "- note 999" not in cut and "\n…\n" in cut
