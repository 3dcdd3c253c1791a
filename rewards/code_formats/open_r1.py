"""open-r1 / PrimeIntellect: the `verification_info` column."""

from __future__ import annotations

import ast
import contextlib
import json
from collections.abc import Mapping
from typing import Any

from grpo_pipeline.rewards.code_formats.apps import io_dict_tests
from grpo_pipeline.rewards.code_formats.cases import (
    PYTHON_LANGUAGES,
    SOLUTION_CLASS,
    CallCase,
    CodeFormat,
    ParsedTests,
    StdioCase,
    TestFormatError,
    as_mapping,
    as_sequence,
    as_text,
    decoded,
)

COLUMN = "verification_info"


def _literal(value: Any, column: str, what: str) -> Any:
    """A function_call value given as text: JSON, else a Python literal; other values as they are."""
    if not isinstance(value, str):
        return value
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    raise TestFormatError(f"column {column!r}: {what} is neither JSON nor a Python literal: {value[:80]!r}")


def _function_call_tests(cases: list[dict[str, Any]], column: str) -> ParsedTests:
    names = {str(case.get("fn_name") or "") for case in cases}
    if len(names) != 1 or not next(iter(names)):
        raise TestFormatError(f"column {column!r}: function_call tests need one 'fn_name'; they give {sorted(names)}")
    calls = []
    for n, case in enumerate(cases):
        args = _literal(case.get("input"), column, f"test_cases[{n}].input")
        expected = case.get("output")
        if isinstance(expected, str):
            # JSON text of the value; a string that is not JSON is the expected string itself
            with contextlib.suppress(json.JSONDecodeError):
                expected = json.loads(expected)
        calls.append(CallCase(tuple(as_sequence(args, column, f"test_cases[{n}].input (the arguments)")), expected))
    return ParsedTests(
        style="call", cases=tuple(calls), entry=next(iter(names)), class_name=SOLUTION_CLASS, unwrap_single=True
    )


def parse_open_r1(row: Mapping[str, Any]) -> ParsedTests:
    """open-r1 `verification_info`; a language other than Python raises, naming it."""
    column = COLUMN
    info = as_mapping(decoded(row[column], column), column, "the value")
    language = info.get("language", "python")
    if str(language).lower() not in PYTHON_LANGUAGES:
        raise TestFormatError(f"column {column!r}: language {language!r} is not supported; only Python programs run")
    tests = decoded(info.get("test_cases"), column)
    if isinstance(tests, dict):  # APPS-style {"inputs", "outputs"} (PrimeIntellect's RL sets), fn_name beside it
        return io_dict_tests(tests, column, info.get("fn_name"))
    cases = [as_mapping(c, column, f"test_cases[{n}]") for n, c in enumerate(as_sequence(tests, column, "test_cases"))]
    kinds = {str(case.get("type", "stdin_stdout")) for case in cases}
    if kinds == {"function_call"}:
        return _function_call_tests(cases, column)
    if not kinds <= {"stdin_stdout"}:
        raise TestFormatError(
            f"column {column!r}: test types {sorted(map(str, kinds))}; all 'stdin_stdout' or all 'function_call' "
            "are supported"
        )
    stdio = tuple(
        StdioCase(as_text(c.get("input"), column, f"test_cases[{n}].input"), as_text(c.get("output"), column, "output"))
        for n, c in enumerate(cases)
    )
    return ParsedTests(style="stdio", cases=stdio)


OPEN_R1 = CodeFormat(
    name="open-r1",
    test_columns=(COLUMN,),
    parse=parse_open_r1,
    stdout_rule="open-r1",
    statement_columns=("problem_statement", "problem", "prompt"),
    id_column="problem_id",
    solutions_column="gold_standard_solution",  # one program, as text
)
