"""CodeContests: `public_tests`, `private_tests` and `generated_tests`, all stdin/stdout."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from grpo_pipeline.rewards.code_formats.cases import (
    CodeFormat,
    ParsedTests,
    StdioCase,
    TestFormatError,
    as_mapping,
    as_text,
    decoded,
    paired,
    plain,
)
from grpo_pipeline.tasks.core.values import is_blank

TEST_COLUMNS = ("public_tests", "private_tests", "generated_tests")


def parse_codecontests(row: Mapping[str, Any]) -> ParsedTests:
    """CodeContests `public_tests` + `private_tests` + `generated_tests`, all stdio."""
    cases: list[StdioCase] = []
    for column in TEST_COLUMNS:
        if is_blank(row.get(column)):
            continue
        tests = as_mapping(decoded(row[column], column), column, "the value")
        if "input" not in tests or "output" not in tests:
            raise TestFormatError(f"column {column!r} needs 'input' and 'output' lists; it has {sorted(tests)}")
        for n, (i, o) in enumerate(paired(tests["input"], tests["output"], column, ("input", "output"))):
            cases.append(StdioCase(as_text(i, column, f"input[{n}]"), as_text(o, column, f"output[{n}]")))
    return ParsedTests(style="stdio", cases=tuple(cases))


def first_python3_solution(value: Any) -> str:
    """The first Python 3 program of CodeContests' `solutions` ({language: [...], solution: [...]}; 3 is PYTHON3 in
    the dataset's Language enum), or ""."""
    if is_blank(value):
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return ""
    value = plain(value)
    if not isinstance(value, dict):
        return ""
    pairs = zip(value.get("language") or [], value.get("solution") or [], strict=False)
    return next((str(code) for language, code in pairs if language == 3), "")


CODECONTESTS = CodeFormat(
    name="codecontests",
    test_columns=TEST_COLUMNS,  # every present one is used, in this order
    parse=parse_codecontests,
    stdout_rule="codecontests",
    statement_columns=("description",),
    id_column="name",
    solutions_column="solutions",
    first_solution=first_python3_solution,
)
