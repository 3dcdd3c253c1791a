"""`grpo-pipeline eval` on a local checkpoint, a registered version, a recipe and a benchmark file, with --compare."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.configs.schema import TinyModelConfig
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
TINY = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=64)
runner = CliRunner()


@pytest.fixture
def model_dir(tmp_path) -> Path:
    return build_tiny_model(TINY, tmp_path / "tiny", seed=0)


@pytest.fixture
def gsm8k_file(tmp_path) -> Path:
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(12)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def invoke(*args: str):
    result = runner.invoke(app, ["eval", *args])
    return result, result.output


def test_eval_a_checkpoint_on_a_benchmark_file_writes_a_report(tmp_path, model_dir, gsm8k_file):
    report = tmp_path / "report.json"
    result, out = invoke(
        "--model", str(model_dir), "--data", str(gsm8k_file), "--n", "4", "--k", "1,2,4", "--max-new-tokens", "3",
        "--output", str(report), "--run-dir", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.exit_code == 0, out
    data = json.loads(report.read_text())
    assert data["num_problems"] == 12 and data["n_samples"] == 4 and set(data["pass_at_k"]) == {"1", "2", "4"}
    assert set(data["maj_at_k"]) == {"1", "2", "4"} and data["config"]["correctness_reward"]["name"] == "correctness"
    low, high = data["accuracy_ci"]
    assert 0 <= low <= data["accuracy"] <= high <= 1
    items = [json.loads(line) for line in Path(data["items_path"]).read_text().splitlines()]
    assert [it["answer"] for it in items] == [str(2 * i) for i in range(12)]  # GSM8K's '#### N', mapped
    assert all(len(it["samples"]) == 4 for it in items)
    assert "accuracy" in out and "pass_at_4" in out


def test_compare_a_model_with_itself_gives_a_zero_difference(tmp_path, model_dir, gsm8k_file):
    report = tmp_path / "report.json"
    result, out = invoke(
        "--model", str(model_dir), "--data", str(gsm8k_file), "--n", "2", "--max-new-tokens", "2",
        "--compare", str(model_dir), "--output", str(report), "--run-dir", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.exit_code == 0, out
    compared = json.loads(report.read_text())["compare"]["metrics"]
    assert compared["accuracy"] == {"model": 0.0, "other": 0.0, "delta": 0.0, "ci_low": 0.0, "ci_high": 0.0} or (
        compared["accuracy"]["delta"] == 0 and compared["accuracy"]["ci_low"] == compared["accuracy"]["ci_high"] == 0
    )
    assert {"accuracy", "pass_at_1", "pass_at_2"} <= set(compared) and "paired bootstrap" in out


def test_compare_leaves_out_tool_statistics_which_have_no_per_item_scores(tmp_path, model_dir, gsm8k_file):
    """A tool-using policy's results carry `tools/*` statistics (EvalResult.tools): compare skips them instead of
    raising on a name outside the metric grammar, and still compares every per-item metric."""
    from grpo_pipeline.eval_cli import compare
    from grpo_pipeline.tasks.scoring.results import EvalResult

    report = tmp_path / "report.json"
    result, out = invoke(
        "--model", str(model_dir), "--data", str(gsm8k_file), "--n", "2", "--max-new-tokens", "2",
        "--output", str(report), "--run-dir", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.exit_code == 0, out
    scored = EvalResult.model_validate_json(report.read_text())
    with_tools = scored.model_copy(update={"tools": {"tools/greedy_call_frequency": 0.5}})
    assert "tools/greedy_call_frequency" in with_tools.metrics()
    compared = compare(with_tools, scored, seed=0)
    assert set(compared) == set(scored.metrics()) and {"accuracy", "pass_at_1", "maj_at_2"} <= set(compared)


def test_eval_a_registered_version_on_a_recipe(tmp_path, model_dir, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("eval-cli")  # not an experiment id left active by another test's store
    from grpo_pipeline.tasks.release.logged_model import log_transformers_model

    with mlflow.start_run():
        info = log_transformers_model(model_dir, "# card\n", max_new_tokens=4)
    version = mlflow.register_model(info.model_uri, "tiny-eval")
    mlflow.MlflowClient().set_registered_model_alias("tiny-eval", "champion", version.version)

    report = tmp_path / "report.json"
    result, out = invoke(
        "--model", "models:/tiny-eval@champion", "--data", str(ROOT / "configs/tiny-arith.yaml"), "--limit", "10",
        "--n", "2", "--output", str(report), "--run-dir", str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.exit_code == 0, out
    data = json.loads(report.read_text())
    assert data["model"] == "models:/tiny-eval@champion" and data["num_problems"] == 10
    assert data["max_new_tokens"] == 5  # the recipe's eval settings
    assert (tmp_path / "runs" / "eval-models" / "tiny-eval-v1" / "config.json").exists()


def test_bad_inputs_exit_2_with_one_clear_line(tmp_path, model_dir, gsm8k_file):
    result, out = invoke("--model", str(tmp_path / "missing"), "--data", str(gsm8k_file))
    assert result.exit_code == 2 and "does not exist" in out
    result, out = invoke("--model", str(model_dir), "--data", str(tmp_path / "none.jsonl"))
    assert result.exit_code == 2 and "none.jsonl" in out and "does not exist" in out
    result, out = invoke("--model", str(model_dir), "--data", str(gsm8k_file), "--n", "2", "--k", "1,5")
    assert result.exit_code == 2 and "exceed" in out
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"query": "1+1", "response": "2"}) + "\n")
    result, out = invoke("--model", str(model_dir), "--data", str(odd))
    assert result.exit_code == 2 and "query" in out
