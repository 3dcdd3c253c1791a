"""Eval adapters for the stdin/stdout and call-based code formats (APPS/TACO, CodeContests, LiveCodeBench, open-r1;
tasks/scoring/adapters.py), and the data stage keeping their test columns (tasks/data.py). Rows are small, shaped like
the published data (rewards/code_formats.py and tests/test_code_formats.py cite where each shape comes from)."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from grpo_pipeline.configs.eval import NO_VOTE_REWARDS
from grpo_pipeline.configs.schema import load_config
from grpo_pipeline.rewards.code_formats import CallCase, ParsedTests, StdioCase, parse_tests
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.scoring.adapters import code_io_prompt
from grpo_pipeline.tasks.scoring.formats import FORMATS, correctness_reward_for, detect_format, load_eval_rows
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.validate import validate_data

CODE_IO_FORMATS = ("apps", "codecontests", "livecodebench", "open-r1")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def apps_rows() -> list[dict[str, Any]]:
    """codeparrot/apps rows: a standard-input problem and a call-based one (input_output is a JSON string)."""
    return [
        {
            "problem_id": 10,
            "question": "Print a + b.",
            "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
            "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
            "difficulty": "introductory",
            "url": "https://example.org/10",
            "starter_code": "",
        },
        {
            "problem_id": 11,
            "question": "Return the sum of a list.",
            "solutions": json.dumps(["def total(xs):\n    return sum(xs)\n"]),
            "input_output": json.dumps({"fn_name": "total", "inputs": [[[1, 2]], [[]]], "outputs": [[3], [0]]}),
            "difficulty": "introductory",
            "url": "https://example.org/11",
            "starter_code": "def total(xs):\n\t",
        },
    ]


def lcb_blob(text: str) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(text))).decode()


# ----------------------------------------------------------------------------- formats and rewards


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (["problem_id", "question", "solutions", "input_output", "difficulty", "url", "starter_code"], "apps"),
        (["question", "solutions", "starter_code", "input_output", "difficulty", "raw_tags", "name", "source"], "apps"),
        (["name", "description", "public_tests", "private_tests", "generated_tests", "solutions"], "codecontests"),
        (
            [
                "question_title",
                "question_content",
                "question_id",
                "public_test_cases",
                "private_test_cases",
                "metadata",
            ],
            "livecodebench",
        ),
        (["problem_id", "problem_statement", "gold_standard_solution", "verification_info", "metadata"], "open-r1"),
        (["problem", "verification_info"], "open-r1"),
    ],
)
def test_detect_code_io_formats(columns: list[str], expected: str) -> None:
    assert detect_format(columns) == expected


def test_code_io_formats_are_judged_by_code_tests_without_majority_votes() -> None:
    assert set(CODE_IO_FORMATS) <= set(FORMATS)
    assert {correctness_reward_for(fmt).name for fmt in CODE_IO_FORMATS} == {"code_tests"}
    assert "code_tests" in NO_VOTE_REWARDS  # a program has no final answer to vote on


# ----------------------------------------------------------------------------- each format


def test_apps_rows_map_to_the_eval_columns_with_their_tests(tmp_path: Path) -> None:
    rows, fmt = load_eval_rows(write_jsonl(tmp_path / "apps.jsonl", apps_rows()))
    assert fmt == "apps"
    assert list(rows.columns) == ["id", "prompt", "answer", "input_output"]
    assert rows["id"].tolist() == ["10", "11"]
    assert rows["answer"].tolist() == ["print(sum(map(int, input().split())))", "def total(xs):\n    return sum(xs)\n"]
    assert rows.loc[0, "prompt"] == (
        "Print a + b.\n\nWrite a Python program that reads the input from standard input and writes the answer to "
        "standard output. Put the whole solution in one ```python code block.\n"
    )
    assert rows.loc[1, "prompt"] == (
        "Return the sum of a list.\n\nComplete this starter code. Put the whole solution in one ```python code "
        "block.\n```python\ndef total(xs):\n```\n"
    )
    assert parse_tests(rows.iloc[0].to_dict()) == ParsedTests(
        "stdio", (StdioCase("1 2\n", "3\n"),), source="apps", stdout_rule="apps"
    )
    assert parse_tests(rows.iloc[1].to_dict()) == ParsedTests(
        "call",
        (CallCase(([1, 2],), [3]), CallCase(([],), [0])),
        entry="total",
        source="apps",
        stdout_rule="apps",
        class_name="Solution",
        unwrap_single=True,
    )


def test_apps_rows_with_decoded_tests_survive_parquet(tmp_path: Path) -> None:
    # input_output as dicts (a JSONL written from `datasets`): stdio rows hold lists of strings, call rows lists of
    # lists, which one Parquet column cannot hold; the eval rows keep them as JSON text, so they can be written
    decoded = [{**r, "input_output": json.loads(r["input_output"])} for r in apps_rows()]
    rows, _ = load_eval_rows(write_jsonl(tmp_path / "apps.jsonl", decoded))
    rows.to_parquet(tmp_path / "eval.parquet", index=False)
    again = pd.read_parquet(tmp_path / "eval.parquet")
    assert [json.loads(v) for v in again["input_output"]] == [r["input_output"] for r in decoded]


def test_codecontests_rows(tmp_path: Path) -> None:
    row = {
        "name": "1_A. Sum",
        "description": "Print a + b.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["2 2\n"], "output": ["4\n"]},
        "generated_tests": {"input": [], "output": []},
        "solutions": {"language": [2, 3], "solution": ["int main() {}", "print(sum(map(int, input().split())))"]},
    }
    rows, fmt = load_eval_rows(write_jsonl(tmp_path / "cc.jsonl", [row]))
    assert fmt == "codecontests"
    assert list(rows.columns) == ["id", "prompt", "answer", "public_tests", "private_tests", "generated_tests"]
    assert rows.loc[0, "id"] == "1_A. Sum"
    assert rows.loc[0, "answer"] == "print(sum(map(int, input().split())))"  # the first PYTHON3 (3) solution
    assert json.loads(rows.loc[0, "public_tests"]) == row["public_tests"]
    parsed = parse_tests(rows.iloc[0].to_dict())
    assert parsed is not None and parsed.cases == (StdioCase("1 2\n", "3\n"), StdioCase("2 2\n", "4\n"))


def test_livecodebench_rows(tmp_path: Path) -> None:
    private = [{"input": "[3, 3]\n6", "output": "[0, 1]", "testtype": "functional"}]
    row = {
        "question_title": "Two Sum",
        "question_content": "Return the indices of the two numbers that add up to target.",
        "platform": "leetcode",
        "question_id": "1",
        "contest_id": "weekly-contest-1",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
        "private_test_cases": lcb_blob(json.dumps(private)),
        "metadata": json.dumps({"func_name": "twoSum"}),
    }
    rows, fmt = load_eval_rows(write_jsonl(tmp_path / "lcb.jsonl", [row]))
    assert fmt == "livecodebench"
    assert list(rows.columns) == ["id", "prompt", "answer", "public_test_cases", "private_test_cases", "metadata"]
    assert rows.loc[0, "id"] == "1" and rows.loc[0, "answer"] == ""
    assert rows.loc[0, "prompt"].endswith("```python\n" + row["starter_code"].rstrip() + "\n```\n")
    assert rows.loc[0, "private_test_cases"] == row["private_test_cases"]  # the blob, as published
    parsed = parse_tests(rows.iloc[0].to_dict())
    assert parsed is not None and parsed.entry == "twoSum" and parsed.class_name == "Solution"
    assert parsed.cases == (CallCase(([2, 7, 11, 15], 9), [0, 1]), CallCase(([3, 3], 6), [0, 1]))


def open_r1_row(language: str = "python") -> dict[str, Any]:
    return {
        "source": "codeforces",
        "task_type": "verifiable_code",
        "problem_statement": "Print a + b.",
        "gold_standard_solution": "```python\nprint(sum(map(int, input().split())))\n```",
        "problem_id": "vfc_1",
        "metadata": {"difficulty": "800"},
        "verification_info": {
            "language": language,
            "test_cases": [{"fn_name": None, "input": "1 2\n", "output": "3\n", "type": "stdin_stdout"}],
        },
    }


def test_open_r1_rows(tmp_path: Path) -> None:
    rows, fmt = load_eval_rows(write_jsonl(tmp_path / "or1.jsonl", [open_r1_row()]))
    assert fmt == "open-r1"
    assert list(rows.columns) == ["id", "prompt", "answer", "verification_info", "metadata"]
    assert rows.loc[0, "id"] == "vfc_1" and rows.loc[0, "answer"].startswith("```python\nprint(")
    parsed = parse_tests(rows.iloc[0].to_dict())
    assert parsed == ParsedTests("stdio", (StdioCase("1 2\n", "3\n"),), source="open-r1", stdout_rule="open-r1")


def test_code_io_prompt_for_a_function_without_starter_code() -> None:
    tests = ParsedTests("call", (CallCase((1,), 1),), entry="f")
    assert code_io_prompt("Double it.", "", tests) == (
        "Double it.\n\nWrite the Python function `f`; its return values are checked. Put the whole solution in one "
        "```python code block.\n"
    )


# ----------------------------------------------------------------------------- rows that cannot be used


def test_rows_with_broken_or_missing_tests_stop_the_load(tmp_path: Path) -> None:
    rows = apps_rows()
    rows[0]["input_output"] = '{"inputs": ["1"], "outputs": []}'
    rows.append({**rows[1], "problem_id": 12, "input_output": ""})
    with pytest.raises(DataError) as e:
        load_eval_rows(write_jsonl(tmp_path / "apps.jsonl", rows))
    message = str(e.value)
    assert "apps.jsonl" in message and "2 row(s) (counted from 0): 0, 2" in message
    assert "column 'input_output' has 1 'inputs' but 0 'outputs'" in message


def test_other_languages_stop_the_load_naming_the_language(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        load_eval_rows(write_jsonl(tmp_path / "or1.jsonl", [open_r1_row(), open_r1_row("cpp")]))
    assert "language 'cpp' is not supported" in str(e.value) and "1 row(s) (counted from 0): 1." in str(e.value)


# ----------------------------------------------------------------------------- the data stage


def test_data_stage_keeps_input_output_intact(tmp_path: Path) -> None:
    # a training file of APPS rows with decoded input_output (mixed shapes), kept with data.extra_columns
    rows = [
        {
            **r,
            "question": f"{r['question']} (variant {i})",
            "input_output": json.loads(r["input_output"]),
        }
        for i in range(6)
        for r in apps_rows()
    ]
    path = write_jsonl(tmp_path / "apps.jsonl", rows)
    cfg = load_config(
        None,
        [
            "data.source=file",
            f"data.path={path}",
            "data.prompt_column=question",
            "data.answer_column=solutions",
            "data.extra_columns=[input_output,starter_code]",
            "data.num_eval=4",
        ],
    ).data
    refs = prepare_data(cfg, str(tmp_path / "run"))
    validate_data(refs, cfg)
    prepared = pd.concat([pd.read_parquet(refs.train.path), pd.read_parquet(refs.eval.path)], ignore_index=True)
    assert len(prepared) == 12
    by_prompt = {r["question"]: r for r in rows}
    for prompt, io in zip(prepared["prompt"], prepared["input_output"], strict=True):
        assert isinstance(io, str) and json.loads(io) == by_prompt[prompt]["input_output"]
        assert parse_tests({"input_output": io}) == parse_tests({"input_output": by_prompt[prompt]["input_output"]})
    assert set(prepared["starter_code"]) == {"", "def total(xs):\n\t"}  # other extra columns as they were
