"""Test cases of public code-RL datasets, parsed from their published columns into one normalized form; and the
registry of those formats, `CODE_FORMATS`.

The package: `cases` (the normalized form, the `CodeFormat` spec, shared value helpers), one module per format
(`apps`, `codecontests`, `livecodebench`, `open_r1`, each ending in its spec), and here the registry and the entry
points (`parse_tests`, `entry_expression`).

Each format is one `CodeFormat`, registered once, in `CODE_FORMATS`: its name, its test columns, its parser, its
stdout rule, and the columns the eval stage reads beside the tests (statement, id, reference solution; its
identifying `signatures` follow from them). Two sides read the registry: the code reward (`parse_tests`, for training
and eval rows alike) and the eval stage, whose benchmark formats (tasks/scoring/formats.py) are built from it. It
lives here, under rewards/, because imports point down: tasks/ may import rewards/, never the reverse, and the
reward has to recognise these rows without the eval stage. So adding a format is a module with its parser and its
spec, listed once in `CODE_FORMATS`; the eval stage then detects, maps and scores it with nothing else to add.

Two kinds of tests come out (`ParsedTests.style`):
  - "stdio": run the whole program with `StdioCase.input` on stdin and compare its stdout with `StdioCase.output`.
  - "call": call one function with `CallCase.args` and compare its return value with `CallCase.expected`.

The formats, by the columns they are published with (first match wins, in this order, `CODE_FORMATS`'s):
  - APPS (Hendrycks et al. 2021, "Measuring Coding Challenge Competence With APPS", huggingface.co/datasets/
    codeparrot/apps) and TACO (Li et al. 2023, huggingface.co/datasets/BAAI/TACO): `input_output`, a JSON string
    (or an already decoded dict) `{"inputs": [...], "outputs": [...], "fn_name"?: str}`. Without `fn_name` each
    input/output is a string, or a list of lines joined with "\\n" as APPS's `eval/testing_util.py` does; with it
    each `inputs[i]` is the list of positional arguments and `outputs[i]` the expected return value.
  - CodeContests (Li et al. 2022, "Competition-Level Code Generation with AlphaCode", huggingface.co/datasets/
    deepmind/code_contests): `public_tests`, `private_tests`, `generated_tests`, each `{"input": [...], "output":
    [...]}`; every present one is used, in that order.
  - LiveCodeBench (Jain et al. 2024, huggingface.co/datasets/livecodebench/code_generation_lite):
    `public_test_cases` and `private_test_cases`, JSON lists of `{"input", "output", "testtype"}` with testtype
    "stdin" or "functional"; the private ones are often base64(zlib(pickle(<JSON string>))). Functional tests call
    `metadata.func_name` (`metadata` is a JSON string column) with one JSON value per input line and compare with
    the JSON value of the output (`lcb_runner/evaluation/testing_util.py`, `grade_call_based`).
  - open-r1 (huggingface.co/datasets/open-r1/verifiable-coding-problems-python, from PrimeIntellect's
    verifiable-coding-problems): `verification_info`, `{"language", "test_cases": [{"type", "input", "output",
    "fn_name"}]}`, type "stdin_stdout" or "function_call" (the latter as PrimeIntellect's genesys checker reads it:
    `input` the list of arguments, `output` the expected value; either may be given as JSON text).

Everything is parsed: how many cases to run, and within what time, is the harness's decision. A column whose value
is missing (None, NaN or an empty string) counts as absent. Malformed tests raise `TestFormatError`, which names the
column and says what is wrong: they are a dataset problem, not the program's.

How stdout is compared is the format's too: each format names the rule of its dataset's own checker
(`CodeFormat.stdout_rule`, carried by the parsed tests as `ParsedTests.stdout_rule`; the harness implements each,
and docs/rewards.md tables them with their sources).

How call results are compared (the harness's job, recorded here because the formats decide it): a returned tuple
counts as a list (both APPS's and LiveCodeBench's checkers convert it); with `unwrap_single` (APPS/TACO) a result
also passes when `[out] == expected`, because APPS wraps most expected return values in a one-element list and its
checker accepts `out == expected or out == expected[0]`. APPS's checker also turns the string keys of a dict
argument back into ints; that quirk is not reproduced.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from grpo_pipeline.rewards.code_formats.apps import APPS
from grpo_pipeline.rewards.code_formats.cases import (
    EXTRA_TEST_COLUMNS,
    CallCase,
    CodeFormat,
    ParsedTests,
    StdioCase,
    StdoutRule,
    TestFormatError,
    json_text,
    plain,
    string_list,
)
from grpo_pipeline.rewards.code_formats.codecontests import CODECONTESTS
from grpo_pipeline.rewards.code_formats.livecodebench import LIVECODEBENCH, decode_private_blob
from grpo_pipeline.rewards.code_formats.open_r1 import OPEN_R1
from grpo_pipeline.tasks.core import python_ast
from grpo_pipeline.tasks.core.values import is_blank

__all__ = [
    "CODE_FORMATS",
    "EXTRA_TEST_COLUMNS",
    "TEST_FORMAT_COLUMNS",
    "CallCase",
    "CodeFormat",
    "ParsedTests",
    "StdioCase",
    "StdoutRule",
    "TestFormatError",
    "decode_private_blob",
    "detect_tests_format",
    "entry_expression",
    "json_text",
    "parse_tests",
    "plain",
    "string_list",
]

# The registry, in detection order: a row's tests are read by the first format with a value in one of its test
# columns (real rows carry one format's columns; the order only settles a row that mixes them).
CODE_FORMATS: tuple[CodeFormat, ...] = (APPS, CODECONTESTS, LIVECODEBENCH, OPEN_R1)

# Every column a format's tests are read from, then what is read beside them.
TEST_FORMAT_COLUMNS: tuple[str, ...] = (*(c for fmt in CODE_FORMATS for c in fmt.test_columns), *EXTRA_TEST_COLUMNS)


def detect_tests_format(row: Mapping[str, Any]) -> CodeFormat | None:
    """The first format (in `CODE_FORMATS` order) with a non-missing test column in `row`, or None."""
    for fmt in CODE_FORMATS:
        if any(not is_blank(row.get(c)) for c in fmt.test_columns):
            return fmt
    return None


def parse_tests(row: Mapping[str, Any]) -> ParsedTests | None:
    """A row's tests in the normalized form, named after their format and carrying its stdout rule; None when the
    row has none of the test columns.

    Raises `TestFormatError` for malformed tests, and for a row whose columns hold no test case at all.
    """
    fmt = detect_tests_format(row)
    if fmt is None:
        return None
    parsed = fmt.parse(row)
    if not parsed.cases:
        present = [c for c in fmt.test_columns if not is_blank(row.get(c))]
        raise TestFormatError(f"column(s) {present} hold no test case")
    return replace(parsed, source=fmt.name, stdout_rule=fmt.stdout_rule)


def entry_expression(tests: ParsedTests, program: str) -> str | None:
    """What to call for "call" tests on `program`: `Solution().fn` when the tests allow a class and the program
    defines it at top level, else `entry` as it is (None for stdio tests)."""
    if tests.entry is None or tests.class_name is None:
        return tests.entry
    try:
        body = python_ast.parse(program).body
    except (SyntaxError, ValueError):  # it will fail to run anyway; the harness reports that
        return tests.entry
    if any(isinstance(node, ast.ClassDef) and node.name == tests.class_name for node in body):
        return f"{tests.class_name}().{tests.entry}"
    return tests.entry
