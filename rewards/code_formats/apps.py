"""APPS and TACO: the `input_output` column (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_pipeline.rewards.code_formats.cases import (
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
    paired,
    string_list,
)
from grpo_pipeline.tasks.core.values import is_blank

COLUMN = "input_output"


def io_dict_tests(io_dict: dict[str, Any], column: str, fn_name: Any = None) -> ParsedTests:
    """APPS-style `{"inputs", "outputs", "fn_name"?}`: stdio without fn_name, call-based with it."""
    if "inputs" not in io_dict or "outputs" not in io_dict:
        raise TestFormatError(f"column {column!r} needs 'inputs' and 'outputs'; it has {sorted(io_dict)}")
    pairs = paired(io_dict["inputs"], io_dict["outputs"], column, ("inputs", "outputs"))
    fn_name = io_dict.get("fn_name") if is_blank(fn_name) else fn_name
    if is_blank(fn_name):
        cases = tuple(
            StdioCase(as_text(i, column, f"inputs[{n}]"), as_text(o, column, f"outputs[{n}]"))
            for n, (i, o) in enumerate(pairs)
        )
        return ParsedTests(style="stdio", cases=cases)
    if not isinstance(fn_name, str):
        raise TestFormatError(f"column {column!r}: 'fn_name' must be a string, not {type(fn_name).__name__}")
    calls = tuple(
        CallCase(tuple(as_sequence(i, column, f"inputs[{n}] (the call's arguments)")), o)
        for n, (i, o) in enumerate(pairs)
    )
    return ParsedTests(style="call", cases=calls, entry=fn_name, class_name=SOLUTION_CLASS, unwrap_single=True)


def parse_apps(row: Mapping[str, Any]) -> ParsedTests:
    """APPS / TACO `input_output` (see the module docstring)."""
    column = COLUMN
    return io_dict_tests(as_mapping(decoded(row[column], column), column, "the value"), column)


def first_solution(value: Any) -> str:
    """The first of APPS's `solutions` (a JSON list of programs), or ""."""
    solutions = string_list(value)
    return solutions[0] if solutions else ""


APPS = CodeFormat(
    name="apps",
    test_columns=(COLUMN,),
    parse=parse_apps,
    stdout_rule="apps",  # TACO rows share APPS's column, and so its checker
    statement_columns=("question",),
    id_column="problem_id",
    solutions_column="solutions",
    first_solution=first_solution,
)
