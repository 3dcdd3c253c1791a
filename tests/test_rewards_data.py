"""Rewards on the real HumanEval and GSM8K files in ../shared/data (skipped cleanly where they are absent)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.math import extract_gold

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
HUMANEVAL = DATA / "HumanEval.jsonl.gz"
GSM8K = DATA / "gsm8k_test.jsonl"


@pytest.fixture(scope="module")
def humaneval() -> list[dict]:
    if not HUMANEVAL.exists():
        pytest.skip(f"{HUMANEVAL} not found (../shared/data beside the repository)")
    return [json.loads(line) for line in gzip.open(HUMANEVAL, "rt")]


@pytest.fixture(scope="module")
def gsm8k() -> list[dict]:
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} not found (../shared/data beside the repository)")
    return [json.loads(line) for line in GSM8K.open()]


def _columns(rows: list[dict]) -> dict[str, list]:
    return {"test": [r["test"] for r in rows], "entry_point": [r["entry_point"] for r in rows]}


@pytest.mark.integration
def test_humaneval_canonical_pass_and_stubs_fail(humaneval: list[dict], code_sandbox: None) -> None:
    fn = build_reward("code_tests", {"timeout_s": 30})  # verdicts, not speed: the suite loads the cores
    prompts = [r["prompt"] for r in humaneval]
    canonical = fn(prompts=prompts, completions=[r["canonical_solution"] for r in humaneval], **_columns(humaneval))
    failed = [r["task_id"] for r, s in zip(humaneval, canonical, strict=True) if s != 1.0]
    assert len(humaneval) == 164 and failed == []
    stubs = fn(prompts=prompts, completions=["    pass\n"] * len(humaneval), **_columns(humaneval))
    passed = [r["task_id"] for r, s in zip(humaneval, stubs, strict=True) if s != 0.0]
    assert passed == []


@pytest.mark.integration
def test_humaneval_through_rewards_score(humaneval: list[dict], tmp_path: Path, code_sandbox: None) -> None:
    source = tmp_path / "completions.jsonl"
    with source.open("w") as fh:
        for r in humaneval:
            base = {"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"], "task_id": r["task_id"]}
            fh.write(json.dumps(base | {"completion": r["canonical_solution"]}) + "\n")
            fh.write(json.dumps(base | {"completion": "    pass\n"}) + "\n")
    out = tmp_path / "scored.jsonl"
    result = CliRunner().invoke(
        app, ["rewards", "score", "--rewards", "code_tests", "--input", str(source), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.open()]
    assert len(rows) == 2 * 164
    assert [r["code_tests"] for r in rows] == [1.0, 0.0] * 164
    assert "code_tests" in result.output and "0.5000" in result.output  # mean over both halves


def test_gsm8k_gold_extraction_and_boxed_answers(gsm8k: list[dict]) -> None:
    from math_verify import parse

    assert len(gsm8k) == 1319
    golds = [extract_gold(r["answer"]) for r in gsm8k]
    unparsed = [g for g in golds if not parse(f"${g}$", parsing_timeout=None)]
    assert unparsed == []
    fn = build_reward("correctness")
    right = fn(
        prompts=[r["question"] for r in gsm8k],
        completions=[f"Step by step... so the answer is \\boxed{{{g}}}." for g in golds],
        answer=[r["answer"] for r in gsm8k],
    )
    assert right == [1.0] * 1319
    sample = gsm8k[:300]
    wrong = fn(
        prompts=[r["question"] for r in sample],
        completions=[f"So the answer is \\boxed{{{float(g) + 1:g}}}." for g in golds[:300]],
        answer=[r["answer"] for r in sample],
    )
    assert wrong == [0.0] * 300


def test_rewards_score_cli_with_recipe_and_errors(tmp_path: Path) -> None:
    source = tmp_path / "arith.jsonl"
    source.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"prompt": "12+34=", "completion": "46", "answer": "46"},
                {"prompt": "1+1=", "completion": "3", "answer": "2"},
                {"prompt": "2+2=", "completion": "four", "answer": "4"},
            ]
        )
        + "\n"
    )
    recipe = Path(__file__).resolve().parents[1] / "configs" / "tiny-arith.yaml"
    out = tmp_path / "scored.jsonl"
    result = CliRunner().invoke(
        app, ["rewards", "score", "--config", str(recipe), "--input", str(source), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.open()]
    assert [(r["correctness"], r["format"]) for r in rows] == [(1.0, 1.0), (0.0, 1.0), (0.0, 0.0)]
    assert rows[0]["prompt"] == "12+34=" and rows[0]["answer"] == "46"
    bad = CliRunner().invoke(app, ["rewards", "score", "--rewards", "nope", "--input", str(source)])
    assert bad.exit_code == 2 and "nope" in bad.output
    both = CliRunner().invoke(app, ["rewards", "score", "--input", str(source)])
    assert both.exit_code != 0
