"""A local data file or dataset directory that is not there is caught in the preflight, as a missing `model.base` is:
one `error:` line naming the field, the path and the fix, exit code 2, before the Prefect server starts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core import python_ast
from grpo_pipeline.tasks.preflight import data_path_problems
from tests.helpers import ROOT, cli_env, micro_overrides, run_cli

RECIPE = "configs/tiny-arith.yaml"


def run(tmp: Path, *overrides: str) -> tuple[int, str]:
    args = ["run", "--config", RECIPE, *micro_overrides(tmp / "runs"), *overrides]
    proc = run_cli(args, cli_env(tmp), timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def assert_caught_in_preflight(code: int, out: str, *fragments: str) -> None:
    assert code == 2, out[-3000:]
    assert out.count("error:") == 1, out[-3000:]
    message = out[out.index("error:") :]
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the error:\n{message}"
    assert "Traceback" not in out, out[-3000:]
    assert "Prefect server" not in out, out[-3000:]  # the CLI names the server it uses only after the preflight


def test_a_missing_data_file_stops_before_prefect_starts(tmp_path):
    code, out = run(tmp_path, "data.source=file", "data.path=/nonexistent.jsonl")
    assert_caught_in_preflight(code, out, "data.path", "'/nonexistent.jsonl'", "does not exist", "set data.path=")


def test_a_relative_data_path_is_named_with_the_working_directory(tmp_path):
    code, out = run(tmp_path, "data.source=file", "data.path=no/such/rows.csv")
    assert_caught_in_preflight(code, out, "data.path", "'no/such/rows.csv'", f"working directory {ROOT}")


def test_a_missing_local_dataset_directory_stops_before_prefect_starts(tmp_path):
    missing = tmp_path / "datasets" / "gsm8k"
    code, out = run(tmp_path, "data.source=hf", f"data.hf_name={missing}")
    assert_caught_in_preflight(code, out, "data.hf_name", str(missing), "does not exist", "hub name")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, "is not a file"),
        ("rows.txt", "unsupported extension (.txt)"),
        ("rows.jsonl", None),
        ("rows.csv.gz", None),
    ],
)
def test_data_path_problems(tmp_path, name, expected):
    path = tmp_path
    if name:
        path = tmp_path / name
        path.write_text("{}\n")
    problems = data_path_problems(DataConfig(source="file", path=str(path)))
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith("data.path ") and expected in problems[0], problems


def test_only_the_source_in_use_is_checked(tmp_path):
    assert data_path_problems(DataConfig(source="synthetic", path="/nonexistent.jsonl")) == []
    assert data_path_problems(DataConfig(source="hf", hf_name="openai/gsm8k")) == []  # a hub name, checked elsewhere


def test_no_preflight_function_is_over_60_lines():
    tree = python_ast.parse((ROOT / "tasks" / "preflight.py").read_text())
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    }
    assert not long, long
