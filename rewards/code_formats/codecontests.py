"""CodeContests: `public_tests`, `private_tests` and `generated_tests`, all stdin/stdout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_pipeline.rewards.code_formats.cases import (
    FORMAT_COLUMNS,
    ParsedTests,
    StdioCase,
    TestFormatError,
    as_mapping,
    as_text,
    decoded,
    is_missing,
    paired,
)


def parse_codecontests(row: Mapping[str, Any]) -> ParsedTests:
    """CodeContests `public_tests` + `private_tests` + `generated_tests`, all stdio."""
    cases: list[StdioCase] = []
    for column in FORMAT_COLUMNS["codecontests"]:
        if is_missing(row.get(column)):
            continue
        tests = as_mapping(decoded(row[column], column), column, "the value")
        if "input" not in tests or "output" not in tests:
            raise TestFormatError(f"column {column!r} needs 'input' and 'output' lists; it has {sorted(tests)}")
        for n, (i, o) in enumerate(paired(tests["input"], tests["output"], column, ("input", "output"))):
            cases.append(StdioCase(as_text(i, column, f"input[{n}]"), as_text(o, column, f"output[{n}]")))
    return ParsedTests(style="stdio", cases=tuple(cases), source="codecontests")
