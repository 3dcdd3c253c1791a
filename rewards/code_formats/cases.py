"""The normalized form every format parses into, the spec each format declares (`CodeFormat`), and the value helpers
they share."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from grpo_pipeline.tasks.core.values import is_blank

# ----------------------------------------------------------------------------- the normalized form


@dataclass(frozen=True)
class StdioCase:
    """Feed `input` to the program's stdin; its stdout must match `output`."""

    input: str
    output: str


@dataclass(frozen=True)
class CallCase:
    """Call the entry with `args` (positional, decoded JSON values); the result must equal `expected`."""

    args: tuple[Any, ...]
    expected: Any


@dataclass(frozen=True)
class ParsedTests:
    """One row's tests in the normalized form.

    `entry` is set for "call" tests: a function name ("twoSum") or an expression ("Solution().twoSum"). When
    `class_name` is set, `entry` is a bare name that the checkers call on an instance of that class when the program
    defines it, else at module level (APPS and LiveCodeBench test `"class Solution" in code`); `entry_expression`
    resolves it for one program. `unwrap_single`: a result `out` also passes when `[out] == expected` (APPS).
    `source` names the format the tests came from and `stdout_rule` is that format's (`parse_tests` sets both from
    its `CodeFormat`); "lines" is the rule for tests of no known dataset.
    """

    style: Literal["stdio", "call"]
    cases: tuple[StdioCase, ...] | tuple[CallCase, ...]
    entry: str | None = None
    source: str = ""
    class_name: str | None = None
    unwrap_single: bool = False
    stdout_rule: StdoutRule = "lines"


class TestFormatError(ValueError):
    """A row's tests cannot be parsed (a dataset problem); the message names the column and says why."""

    __test__ = False  # not a pytest test class, despite its name


# How stdin/stdout tests compare stdout with the expected output: each format names the rule of its dataset's own
# checker (`CodeFormat.stdout_rule`); the harness's `STDOUT_RULES` implements each, and docs/rewards.md tables them
# with the checker each one follows. "lines" is for tests of no known dataset.
StdoutRule = Literal["lines", "apps", "livecodebench", "codecontests", "open-r1"]

# Read beside a format's tests (LiveCodeBench's `metadata` names the function its functional tests call); rows keep it
# with every format's tests, so the code reward sees what it may read.
EXTRA_TEST_COLUMNS: tuple[str, ...] = ("metadata",)


@dataclass(frozen=True)
class CodeFormat:
    """One stdin/stdout or call-based code format: the columns it is published with and how its tests are read.

    `test_columns` hold the tests, in the order `parse` reads them; a row of this format has a value in at least one
    (that is how `parse_tests` recognises a row), and every table of it has the first, with one of
    `statement_columns` (`signatures`: how the eval stage recognises a table). `parse` turns a row's test columns into
    `ParsedTests` (raising `TestFormatError`); `stdout_rule` is how its dataset's checker compares stdout. For eval
    rows (tasks/scoring/adapters.py): the problem statement is the first of `statement_columns` present, its id is
    `id_column`, and its reference solution comes from `solutions_column` (absent: none is published), picked by
    `first_solution` when that column holds several (None: the column's text is the program).
    """

    name: str
    test_columns: tuple[str, ...]
    parse: Callable[[Mapping[str, Any]], ParsedTests]
    stdout_rule: StdoutRule
    statement_columns: tuple[str, ...]
    id_column: str
    solutions_column: str | None = None
    first_solution: Callable[[Any], str] | None = None

    @property
    def signatures(self) -> tuple[frozenset[str], ...]:
        """The column sets that identify a table of this format: a statement column and the first test column."""
        return tuple(frozenset({statement, self.test_columns[0]}) for statement in self.statement_columns)


SOLUTION_CLASS = "Solution"  # LeetCode-style problems put the function in `class Solution`
MAX_DECOMPRESSED_BYTES = 1 << 30  # a zlib bomb in a private-test blob stops here, not when memory runs out
PYTHON_LANGUAGES = ("python", "python3")


# ----------------------------------------------------------------------------- value helpers


def plain(value: Any) -> Any:
    """`value` as plain Python: Parquet/Arrow give numpy arrays for lists (`tolist`), tuples become lists."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return plain(value.tolist())
    return value


def string_list(value: Any) -> list[str] | None:
    """A list of strings from a list, an array (Parquet) or its JSON / Python literal text (CSV); None if not one."""
    if isinstance(value, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(value)
                break
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
        else:
            return None
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        return None
    return [str(v) for v in value]


def json_text(value: Any) -> Any:
    """A test column's value as JSON text (missing values and strings unchanged), so that rows of one column have
    one type whatever their shapes: Parquet cannot store a column mixing e.g. lists of strings and lists of lists."""
    if is_blank(value) or isinstance(value, str):
        return value
    return json.dumps(plain(value))


def decoded(value: Any, column: str) -> Any:
    """A column's value, decoded from JSON text when it is a string."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise TestFormatError(f"column {column!r} is not valid JSON ({e.msg} at character {e.pos})") from None
    return plain(value)


def as_mapping(value: Any, column: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TestFormatError(f"column {column!r}: {what} must be a JSON object, not {type(value).__name__}")
    return value


def as_sequence(value: Any, column: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TestFormatError(f"column {column!r}: {what} must be a list, not {type(value).__name__}")
    return value


def as_text(value: Any, column: str, what: str) -> str:
    """A stdin/stdout text: a string, or a list of lines joined with newlines (APPS's `testing_util.py`)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if not isinstance(value, str):
        raise TestFormatError(f"column {column!r}: {what} must be a string, not {type(value).__name__}")
    return value


def paired(inputs: Any, outputs: Any, column: str, keys: tuple[str, str]) -> list[tuple[Any, Any]]:
    inputs = as_sequence(inputs, column, f"{keys[0]!r}")
    outputs = as_sequence(outputs, column, f"{keys[1]!r}")
    if len(inputs) != len(outputs):
        raise TestFormatError(
            f"column {column!r} has {len(inputs)} {keys[0]!r} but {len(outputs)} {keys[1]!r}; they must pair up"
        )
    return list(zip(inputs, outputs, strict=True))
