"""`grpo-pipeline eval` keeps each model's per-item scores apart: a later run never writes over the items an earlier
report points to, `--compare` reads the items of the model it names, and the report shows what was unscored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.configs.schema import TinyModelConfig
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

TINY = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=64)


@pytest.fixture
def gsm8k_file(tmp_path) -> Path:
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(8)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evaluate(tmp_path: Path, data: Path, model: Path, report: Path, *extra: str) -> dict:
    args = ["eval", "--model", str(model), "--data", str(data), "--n", "2", "--max-new-tokens", "4"]
    result = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path / "runs"), "--output", str(report), *extra])
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text())


def samples(items_path: str) -> list[list[str]]:
    return [json.loads(line)["samples"] for line in Path(items_path).read_text().splitlines()]


def test_two_models_in_a_row_keep_their_own_items_and_compare_reads_the_right_ones(tmp_path, gsm8k_file):
    first, second = (build_tiny_model(TINY, tmp_path / name, seed=seed) for name, seed in (("a", 0), ("b", 1)))
    a = evaluate(tmp_path, gsm8k_file, first, tmp_path / "a.json")
    a_items = samples(a["items_path"])
    b = evaluate(tmp_path, gsm8k_file, second, tmp_path / "b.json")
    assert samples(b["items_path"]) != a_items  # two different models: a test that could tell them apart
    assert a["items_path"] != b["items_path"]
    assert samples(a["items_path"]) == a_items  # the first report's items are still the first model's

    both = evaluate(tmp_path, gsm8k_file, first, tmp_path / "both.json", "--compare", str(second))
    assert samples(both["items_path"]) == a_items
    assert both["compare"]["items_path"] == b["items_path"]  # the same model, data and settings: the same place
    assert samples(both["compare"]["items_path"]) == samples(b["items_path"])
    assert both["compare"]["metrics"]["accuracy"]["n"] == 8


def test_other_settings_keep_their_own_items(tmp_path, gsm8k_file):
    model = build_tiny_model(TINY, tmp_path / "a", seed=0)
    two = evaluate(tmp_path, gsm8k_file, model, tmp_path / "two.json")
    three = evaluate(tmp_path, gsm8k_file, model, tmp_path / "three.json", "--limit", "3")
    assert two["items_path"] != three["items_path"]
    assert len(Path(two["items_path"]).read_text().splitlines()) == 8


def test_the_report_shows_what_was_scored(tmp_path, gsm8k_file):
    model = build_tiny_model(TINY, tmp_path / "a", seed=0)
    args = ["eval", "--model", str(model), "--data", str(gsm8k_file), "--n", "2", "--max-new-tokens", "2"]
    result = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path / "runs"), "--output", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "items scored" in result.output and "8/8" in result.output
    report = json.loads((tmp_path / "r").read_text())
    assert report["unscored"]["accuracy"] == 0 and report["unscored_completions"] == 0
