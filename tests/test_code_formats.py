"""Parsing the test columns of public code-RL datasets (rewards/code_formats.py). Each row below is shaped like the
published data (the dataset cards and the datasets' own loaders, cited per test); values are small made-up ones."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_pipeline.rewards.code_formats import (
    TEST_FORMAT_COLUMNS,
    CallCase,
    ParsedTests,
    StdioCase,
    TestFormatError,
    decode_private_blob,
    entry_expression,
    json_text,
    parse_tests,
)


def lcb_blob(payload: Any) -> str:
    """LiveCodeBench's encoding of private tests: base64(zlib(pickle(...))) of (normally) a JSON string."""
    return base64.b64encode(zlib.compress(pickle.dumps(payload))).decode()


# ----------------------------------------------------------------------------- APPS / TACO


def test_apps_stdio_row() -> None:
    # codeparrot/apps: problem_id, question, solutions (JSON list), input_output (JSON string), difficulty, url,
    # starter_code; a standard-input problem has no fn_name
    row = {
        "problem_id": 0,
        "question": "Read two integers and print their sum.",
        "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)\n"]),
        "input_output": json.dumps({"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}),
        "difficulty": "introductory",
        "url": "https://codeforces.com/problemset/problem/1/A",
        "starter_code": "",
    }
    assert parse_tests(row) == ParsedTests(
        style="stdio", cases=(StdioCase("1 2\n", "3\n"), StdioCase("5 5\n", "10\n")), source="apps", stdout_rule="apps"
    )


def test_apps_lines_are_joined_with_newlines() -> None:
    # some APPS problems store an input/output as a list of lines; APPS's testing_util.py joins them with "\n"
    row = {"input_output": json.dumps({"inputs": [["2", "1 2"]], "outputs": [["3", "done"]]})}
    assert parse_tests(row) == ParsedTests(
        style="stdio", cases=(StdioCase("2\n1 2", "3\ndone"),), source="apps", stdout_rule="apps"
    )


def test_apps_call_based_row_keeps_the_wrapped_expected_values() -> None:
    # a Codewars-style APPS problem: fn_name, inputs[i] the argument list, outputs[i] the expected value, most often
    # wrapped in a one-element list (APPS's checker accepts out == expected or out == expected[0])
    io = {"fn_name": "add_lists", "inputs": [[[1, 2], [3]], [[], []]], "outputs": [[[1, 2, 3]], [[]]]}
    row = {"question": "Concatenate two lists.", "starter_code": "def add_lists(a, b):\n\t", "input_output": io}
    expected = ParsedTests(
        style="call",
        cases=(CallCase(([1, 2], [3]), [[1, 2, 3]]), CallCase(([], []), [[]])),
        entry="add_lists",
        source="apps",
        stdout_rule="apps",
        class_name="Solution",
        unwrap_single=True,
    )
    assert parse_tests(row) == expected  # an already decoded dict (TACO via `datasets`, or a JSONL file)
    assert parse_tests({**row, "input_output": json.dumps(io)}) == expected  # the published JSON string


def test_taco_row_parses_like_apps() -> None:
    # BAAI/TACO: question, solutions, starter_code, input_output (same JSON), difficulty, raw_tags, name, source, ...
    row = {
        "question": "Return the n-th Fibonacci number.",
        "solutions": json.dumps(["class Solution:\n    def fib(self, n):\n        ..."]),
        "starter_code": "class Solution:\n    def fib(self, n: int) -> int:\n        ",
        "input_output": json.dumps({"fn_name": "fib", "inputs": [[10]], "outputs": [55]}),
        "difficulty": "EASY",
        "source": "leetcode",
    }
    parsed = parse_tests(row)
    assert parsed is not None and parsed.cases == (CallCase((10,), 55),) and parsed.entry == "fib"


# ----------------------------------------------------------------------------- CodeContests


def test_codecontests_row_uses_public_private_and_generated_tests() -> None:
    # deepmind/code_contests: name, description, public_tests/private_tests/generated_tests ({input: [...], output:
    # [...]}), source, difficulty, solutions ({language: [...], solution: [...]}), ...
    row = {
        "name": "1_A. Sum",
        "description": "Print a + b.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": json.dumps({"input": ["2 2\n"], "output": ["4\n"]}),  # a JSON string works too
        "generated_tests": {"input": ["0 0\n", "9 1\n"], "output": ["0\n", "10\n"]},
        "solutions": {"language": [3], "solution": ["print(sum(map(int, input().split())))"]},
    }
    assert parse_tests(row) == ParsedTests(
        style="stdio",
        cases=(
            StdioCase("1 2\n", "3\n"),
            StdioCase("2 2\n", "4\n"),
            StdioCase("0 0\n", "0\n"),
            StdioCase("9 1\n", "10\n"),
        ),
        source="codecontests",
        stdout_rule="codecontests",
    )


def test_codecontests_from_parquet_holds_numpy_arrays() -> None:
    # `datasets.Dataset.to_pandas()` and Parquet give the lists of a struct column as numpy arrays
    row = {
        "public_tests": {"input": np.array(["1\n"], dtype=object), "output": np.array(["2\n"], dtype=object)},
        "private_tests": {"input": np.array([], dtype=object), "output": np.array([], dtype=object)},
        "generated_tests": None,
    }
    assert parse_tests(row) == ParsedTests(
        style="stdio", cases=(StdioCase("1\n", "2\n"),), source="codecontests", stdout_rule="codecontests"
    )


# ----------------------------------------------------------------------------- LiveCodeBench


def lcb_row(public: list[dict[str, str]], private: str, metadata: str = "{}") -> dict[str, Any]:
    # livecodebench/code_generation_lite: question_title, question_content, platform, question_id, contest_id,
    # contest_date, starter_code, difficulty, public_test_cases (JSON), private_test_cases (JSON or the compressed
    # blob), metadata (JSON string)
    return {
        "question_title": "Sum",
        "question_content": "Print the sum of the numbers.",
        "platform": "atcoder",
        "question_id": "abc000_a",
        "contest_id": "abc000",
        "contest_date": "2024-01-01T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps(public),
        "private_test_cases": private,
        "metadata": metadata,
    }


def test_livecodebench_stdin_row_with_compressed_private_tests() -> None:
    public = [{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]
    private = [{"input": "1\n5\n", "output": "5\n", "testtype": "stdin"}]
    row = lcb_row(public, lcb_blob(json.dumps(private)))
    assert parse_tests(row) == ParsedTests(
        style="stdio",
        cases=(StdioCase("3\n1 2 3\n", "6\n"), StdioCase("1\n5\n", "5\n")),
        source="livecodebench",
        stdout_rule="livecodebench",
    )
    # older releases store the private cases as plain JSON
    assert parse_tests(lcb_row(public, json.dumps(private))) == parse_tests(row)


def test_livecodebench_functional_row_calls_the_metadata_function() -> None:
    # LeetCode problems: one JSON value per input line, the output one JSON value, metadata names the method
    public = [{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"}]
    private = [{"input": '"abc"\n{"k": true}\n', "output": "null", "testtype": "functional"}]
    row = lcb_row(public, lcb_blob(json.dumps(private)), metadata=json.dumps({"func_name": "twoSum"}))
    assert parse_tests(row) == ParsedTests(
        style="call",
        cases=(CallCase(([2, 7, 11, 15], 9), [0, 1]), CallCase(("abc", {"k": True}), None)),
        entry="twoSum",
        source="livecodebench",
        stdout_rule="livecodebench",
        class_name="Solution",
        unwrap_single=False,
    )


def test_private_blob_of_bytes_decodes() -> None:
    text = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    assert decode_private_blob(lcb_blob(text.encode())) == text


class Exploit:
    """Unpickling this would run a shell command (pickle's __reduce__ protocol)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_hostile_pickles_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for payload in (Exploit(marker), OrderedDict(a=1), Path("/etc")):
        row = lcb_row([{"input": "1\n", "output": "1\n", "testtype": "stdin"}], lcb_blob(payload))
        with pytest.raises(TestFormatError, match=r"private_test_cases.*only a pickled string is accepted"):
            parse_tests(row)
    assert not marker.exists()
    with pytest.raises(TestFormatError, match=r"private_test_cases.*pickled list, not the expected string"):
        decode_private_blob(lcb_blob([{"input": "1"}]))  # plain data, but not the JSON text of the format


# ----------------------------------------------------------------------------- open-r1


def open_r1_row(test_cases: list[dict[str, Any]], language: str = "python") -> dict[str, Any]:
    # open-r1/verifiable-coding-problems-python: source, task_type, in_source_id, problem_statement,
    # gold_standard_solution, problem_id, metadata (struct), verification_info (struct: language, test_cases list
    # of {fn_name, input, output, type})
    return {
        "source": "codeforces",
        "task_type": "verifiable_code",
        "in_source_id": "1_A",
        "problem_statement": "Print a + b.",
        "gold_standard_solution": "```python\nprint(sum(map(int, input().split())))\n```",
        "problem_id": "vfc_1",
        "metadata": {"difficulty": "800", "time_limit": "1 second"},
        "verification_info": {"language": language, "test_cases": test_cases},
    }


def test_open_r1_stdin_stdout_row() -> None:
    cases = [
        {"fn_name": None, "input": "1 2\n", "output": "3\n", "type": "stdin_stdout"},
        {"fn_name": None, "input": "4 4\n", "output": "8\n", "type": "stdin_stdout"},
    ]
    expected = ParsedTests(
        style="stdio",
        cases=(StdioCase("1 2\n", "3\n"), StdioCase("4 4\n", "8\n")),
        source="open-r1",
        stdout_rule="open-r1",
    )
    row = open_r1_row(cases)
    assert parse_tests(row) == expected
    # PrimeIntellect's original publishes verification_info as a JSON string
    assert parse_tests({**row, "verification_info": json.dumps(row["verification_info"])}) == expected


def test_open_r1_function_call_row() -> None:
    # function_call cases as PrimeIntellect's genesys checker reads them: input the argument list, output the value
    cases = [
        {"fn_name": "add", "input": "[1, 2]", "output": "[3]", "type": "function_call"},
        {"fn_name": "add", "input": [[5], [6]], "output": [[5, 6]], "type": "function_call"},
        {"fn_name": "add", "input": "['a', 'b']", "output": "ab", "type": "function_call"},  # Python literal, text
    ]
    assert parse_tests(open_r1_row(cases)) == ParsedTests(
        style="call",
        cases=(CallCase((1, 2), [3]), CallCase(([5], [6]), [[5, 6]]), CallCase(("a", "b"), "ab")),
        entry="add",
        source="open-r1",
        stdout_rule="open-r1",
        class_name="Solution",
        unwrap_single=True,
    )


def test_open_r1_other_languages_are_refused_by_name() -> None:
    row = open_r1_row([{"input": "1\n", "output": "1\n", "type": "stdin_stdout"}], language="cpp")
    with pytest.raises(TestFormatError, match=r"verification_info.*language 'cpp' is not supported"):
        parse_tests(row)


# ----------------------------------------------------------------------------- absent and malformed tests


def test_rows_without_test_columns_give_none() -> None:
    assert parse_tests({}) is None
    assert parse_tests({"prompt": "x", "test": "def check(c): pass", "entry_point": "f"}) is None  # HumanEval
    assert parse_tests({"input_output": None, "public_tests": float("nan"), "verification_info": ""}) is None
    assert parse_tests({"metadata": '{"func_name": "f"}'}) is None  # metadata alone holds no tests


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"input_output": "{not json"}, r"column 'input_output' is not valid JSON"),
        ({"input_output": '["1"]'}, r"column 'input_output': the value must be a JSON object, not list"),
        ({"input_output": '{"inputs": ["1"]}'}, r"column 'input_output' needs 'inputs' and 'outputs'"),
        ({"input_output": '{"inputs": ["1", "2"], "outputs": ["1"]}'}, r"2 'inputs' but 1 'outputs'"),
        ({"input_output": '{"inputs": [], "outputs": []}'}, r"column\(s\) \['input_output'\] hold no test case"),
        ({"input_output": '{"inputs": [1], "outputs": ["1"]}'}, r"'input_output': inputs\[0\] must be a string"),
        (
            {"input_output": '{"fn_name": "f", "inputs": [3], "outputs": [3]}'},
            r"'input_output': inputs\[0\] \(the call's arguments\) must be a list, not int",
        ),
        ({"public_tests": {"input": ["1"]}}, r"column 'public_tests' needs 'input' and 'output' lists"),
        (
            {"public_tests": {"input": [], "output": []}, "private_tests": {"input": [], "output": []}},
            r"\['public_tests', 'private_tests'\] hold no test case",
        ),
        ({"public_test_cases": '[{"input": "1"}]'}, r"'public_test_cases': case 0 has no \['output', 'testtype'\]"),
        (
            {"public_test_cases": '[{"input": "1", "output": "1", "testtype": "functional"}]'},
            r"column 'metadata' has no 'func_name'",
        ),
        (
            {
                "public_test_cases": '[{"input": "1", "output": "1", "testtype": "stdin"}]',
                "private_test_cases": '[{"input": "1", "output": "1", "testtype": "functional"}]',
            },
            r"testtype\(s\) \['functional', 'stdin'\]",
        ),
        (
            {
                "public_test_cases": '[{"input": "not json", "output": "1", "testtype": "functional"}]',
                "metadata": '{"func_name": "f"}',
            },
            r"'public_test_cases': an input line is not valid JSON",
        ),
        ({"private_test_cases": "@@not base64@@"}, r"column 'private_test_cases' is neither JSON nor base64"),
        ({"private_test_cases": base64.b64encode(b"plain").decode()}, r"'private_test_cases' is base64 but not zlib"),
        ({"verification_info": {"language": "python"}}, r"'verification_info': test_cases must be a list"),
        (
            {
                "verification_info": {
                    "language": "python",
                    "test_cases": [
                        {"input": "1", "output": "1", "type": "stdin_stdout"},
                        {"fn_name": "f", "input": "[1]", "output": "1", "type": "function_call"},
                    ],
                }
            },
            r"'verification_info': test types \['function_call', 'stdin_stdout'\]",
        ),
        (
            {
                "verification_info": {
                    "language": "python",
                    "test_cases": [{"fn_name": "f", "input": "1 +", "output": "1", "type": "function_call"}],
                }
            },
            r"test_cases\[0\].input is neither JSON nor a Python literal",
        ),
    ],
)
def test_malformed_tests_name_the_column(row: dict[str, Any], message: str) -> None:
    with pytest.raises(TestFormatError, match=message):
        parse_tests(row)


# ----------------------------------------------------------------------------- helpers


def test_test_format_columns_list_every_column_read() -> None:
    assert set(TEST_FORMAT_COLUMNS) == {
        "input_output",
        "public_tests",
        "private_tests",
        "generated_tests",
        "public_test_cases",
        "private_test_cases",
        "metadata",
        "verification_info",
    }


def test_entry_expression_uses_the_class_only_when_the_program_defines_it() -> None:
    tests = ParsedTests(style="call", cases=(CallCase((1,), 1),), entry="fib", class_name="Solution")
    method = "class Solution:\n    def fib(self, n):\n        return n\n"
    assert entry_expression(tests, method) == "Solution().fib"
    assert entry_expression(tests, "def fib(n):\n    return n\n") == "fib"
    assert entry_expression(tests, "def fib(n:\n") == "fib"  # a syntax error: the run reports it
    leetcode = ParsedTests(style="call", cases=(CallCase((1,), 1),), entry="Solution().fib")
    assert entry_expression(leetcode, "def fib(n): ...") == "Solution().fib"
    assert entry_expression(ParsedTests(style="stdio", cases=()), method) is None


def test_json_text_makes_one_type_per_column() -> None:
    assert json_text({"inputs": [np.array([1, 2])], "outputs": (3,)}) == '{"inputs": [[1, 2]], "outputs": [3]}'
    assert json_text('{"inputs": []}') == '{"inputs": []}'
    assert json_text(None) is None
