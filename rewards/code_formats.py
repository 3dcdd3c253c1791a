"""Test cases of public code-RL datasets, parsed from their published columns into one normalized form.

Two kinds of tests come out (`ParsedTests.style`):
  - "stdio": run the whole program with `StdioCase.input` on stdin and compare its stdout with `StdioCase.output`.
  - "call": call one function with `CallCase.args` and compare its return value with `CallCase.expected`.

The formats, by the columns they are published with (first match wins, in this order):
  - APPS (Hendrycks et al. 2021, "Measuring Coding Challenge Competence With APPS", huggingface.co/datasets/
    codeparrot/apps) and TACO (Li et al. 2023, huggingface.co/datasets/BAAI/TACO): `input_output`, a JSON string
    (or an already decoded dict) `{"inputs": [...], "outputs": [...], "fn_name"?: str}`. Without `fn_name` each
    input/output is a string, or a list of lines joined with "\\n" as APPS's `eval/testing_util.py` does; with it
    each `inputs[i]` is the list of positional arguments and `outputs[i]` the expected return value.
  - LiveCodeBench (Jain et al. 2024, huggingface.co/datasets/livecodebench/code_generation_lite):
    `public_test_cases` and `private_test_cases`, JSON lists of `{"input", "output", "testtype"}` with testtype
    "stdin" or "functional"; the private ones are often base64(zlib(pickle(<JSON string>))). Functional tests call
    `metadata.func_name` (`metadata` is a JSON string column) with one JSON value per input line and compare with
    the JSON value of the output (`lcb_runner/evaluation/testing_util.py`, `grade_call_based`).
  - CodeContests (Li et al. 2022, "Competition-Level Code Generation with AlphaCode", huggingface.co/datasets/
    deepmind/code_contests): `public_tests`, `private_tests`, `generated_tests`, each `{"input": [...], "output":
    [...]}`; every present one is used, in that order.
  - open-r1 (huggingface.co/datasets/open-r1/verifiable-coding-problems-python, from PrimeIntellect's
    verifiable-coding-problems): `verification_info`, `{"language", "test_cases": [{"type", "input", "output",
    "fn_name"}]}`, type "stdin_stdout" or "function_call" (the latter as PrimeIntellect's genesys checker reads it:
    `input` the list of arguments, `output` the expected value; either may be given as JSON text).

Everything is parsed: how many cases to run, and within what time, is the harness's decision. A column whose value
is missing (None, NaN or an empty string) counts as absent. Malformed tests raise `TestFormatError`, which names the
column and says what is wrong: they are a dataset problem, not the program's.

How call results are compared (the harness's job, recorded here because the formats decide it): a returned tuple
counts as a list (both APPS's and LiveCodeBench's checkers convert it); with `unwrap_single` (APPS/TACO) a result
also passes when `[out] == expected`, because APPS wraps most expected return values in a one-element list and its
checker accepts `out == expected or out == expected[0]`. APPS's checker also turns the string keys of a dict
argument back into ints; that quirk is not reproduced.
"""

from __future__ import annotations

import ast
import base64
import binascii
import contextlib
import io
import json
import pickle
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

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
    `source` names the format: "apps", "livecodebench", "codecontests" or "open-r1".
    """

    style: Literal["stdio", "call"]
    cases: tuple[StdioCase, ...] | tuple[CallCase, ...]
    entry: str | None = None
    source: str = ""
    class_name: str | None = None
    unwrap_single: bool = False


class TestFormatError(ValueError):
    """A row's tests cannot be parsed (a dataset problem); the message names the column and says why."""

    __test__ = False  # not a pytest test class, despite its name


# The columns each format reads, in the order they are tried; `metadata` only supplies LiveCodeBench's func_name.
FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "apps": ("input_output",),
    "livecodebench": ("public_test_cases", "private_test_cases"),
    "codecontests": ("public_tests", "private_tests", "generated_tests"),
    "open-r1": ("verification_info",),
}
TEST_FORMAT_COLUMNS: tuple[str, ...] = (*(c for cols in FORMAT_COLUMNS.values() for c in cols), "metadata")

SOLUTION_CLASS = "Solution"  # LeetCode-style problems put the function in `class Solution`
MAX_DECOMPRESSED_BYTES = 1 << 30  # a zlib bomb in a private-test blob stops here, not when memory runs out
PYTHON_LANGUAGES = ("python", "python3")


# ----------------------------------------------------------------------------- value helpers


def is_missing(value: Any) -> bool:
    """None, NaN (pandas' missing), pandas.NA or a blank string."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return True
    if isinstance(value, float):
        return value != value
    return isinstance(value, str) and not value.strip()


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


def json_text(value: Any) -> Any:
    """A test column's value as JSON text (missing values and strings unchanged), so that rows of one column have
    one type whatever their shapes: Parquet cannot store a column mixing e.g. lists of strings and lists of lists."""
    if is_missing(value) or isinstance(value, str):
        return value
    return json.dumps(plain(value))


def _decoded(value: Any, column: str) -> Any:
    """A column's value, decoded from JSON text when it is a string."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise TestFormatError(f"column {column!r} is not valid JSON ({e.msg} at character {e.pos})") from None
    return plain(value)


def _mapping(value: Any, column: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TestFormatError(f"column {column!r}: {what} must be a JSON object, not {type(value).__name__}")
    return value


def _sequence(value: Any, column: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TestFormatError(f"column {column!r}: {what} must be a list, not {type(value).__name__}")
    return value


def _text(value: Any, column: str, what: str) -> str:
    """A stdin/stdout text: a string, or a list of lines joined with newlines (APPS's `testing_util.py`)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if not isinstance(value, str):
        raise TestFormatError(f"column {column!r}: {what} must be a string, not {type(value).__name__}")
    return value


def _pairs(inputs: Any, outputs: Any, column: str, keys: tuple[str, str]) -> list[tuple[Any, Any]]:
    inputs = _sequence(inputs, column, f"{keys[0]!r}")
    outputs = _sequence(outputs, column, f"{keys[1]!r}")
    if len(inputs) != len(outputs):
        raise TestFormatError(
            f"column {column!r} has {len(inputs)} {keys[0]!r} but {len(outputs)} {keys[1]!r}; they must pair up"
        )
    return list(zip(inputs, outputs, strict=True))


# ----------------------------------------------------------------------------- APPS / TACO


def _io_dict_tests(io_dict: dict[str, Any], column: str, fn_name: Any = None) -> ParsedTests:
    """APPS-style `{"inputs", "outputs", "fn_name"?}`: stdio without fn_name, call-based with it."""
    if "inputs" not in io_dict or "outputs" not in io_dict:
        raise TestFormatError(f"column {column!r} needs 'inputs' and 'outputs'; it has {sorted(io_dict)}")
    pairs = _pairs(io_dict["inputs"], io_dict["outputs"], column, ("inputs", "outputs"))
    fn_name = io_dict.get("fn_name") if is_missing(fn_name) else fn_name
    if is_missing(fn_name):
        cases = tuple(
            StdioCase(_text(i, column, f"inputs[{n}]"), _text(o, column, f"outputs[{n}]"))
            for n, (i, o) in enumerate(pairs)
        )
        return ParsedTests(style="stdio", cases=cases, source="apps")
    if not isinstance(fn_name, str):
        raise TestFormatError(f"column {column!r}: 'fn_name' must be a string, not {type(fn_name).__name__}")
    calls = tuple(
        CallCase(tuple(_sequence(i, column, f"inputs[{n}] (the call's arguments)")), o)
        for n, (i, o) in enumerate(pairs)
    )
    return ParsedTests(
        style="call", cases=calls, entry=fn_name, source="apps", class_name=SOLUTION_CLASS, unwrap_single=True
    )


def parse_apps(row: Mapping[str, Any]) -> ParsedTests:
    """APPS / TACO `input_output` (see the module docstring)."""
    column = "input_output"
    return _io_dict_tests(_mapping(_decoded(row[column], column), column, "the value"), column)


# ----------------------------------------------------------------------------- LiveCodeBench


class _StringOnlyUnpickler(pickle.Unpickler):
    """Loads pickles of plain data only: every global (class, function) is refused, so nothing can be called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the pickle names {module}.{name}; only a pickled string is accepted")


def decode_private_blob(blob: str | bytes, column: str = "private_test_cases") -> str:
    """The JSON text inside LiveCodeBench's compressed private tests: base64(zlib(pickle(<str>))).

    LiveCodeBench's loader calls `pickle.loads` on the blob; here a restricted unpickler refuses every global, so a
    hostile pickle cannot run anything, and only a pickled `str` (or `bytes`) is accepted.
    """
    try:
        compressed = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError) as e:
        raise TestFormatError(f"column {column!r} is neither JSON nor base64 ({e})") from None
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(compressed, MAX_DECOMPRESSED_BYTES)
    except zlib.error as e:
        raise TestFormatError(f"column {column!r} is base64 but not zlib data ({e})") from None
    if inflate.unconsumed_tail:
        raise TestFormatError(f"column {column!r} inflates to more than {MAX_DECOMPRESSED_BYTES} bytes")
    try:
        value = _StringOnlyUnpickler(io.BytesIO(raw)).load()
    except Exception as e:  # any malformed or refused pickle: UnpicklingError, EOFError, ValueError, ...
        raise TestFormatError(f"column {column!r} holds an unacceptable pickle ({type(e).__name__}: {e})") from None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise TestFormatError(f"column {column!r} holds a pickled {type(value).__name__}, not the expected string")
    return value


def _lcb_cases(value: Any, column: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if column != "private_test_cases":
                raise TestFormatError(f"column {column!r} is not valid JSON") from None
            value = _decoded(decode_private_blob(value, column), column)
    cases = _sequence(plain(value), column, "the test cases")
    for n, case in enumerate(cases):
        _mapping(case, column, f"case {n}")
        missing = {"input", "output", "testtype"} - set(case)
        if missing:
            raise TestFormatError(f"column {column!r}: case {n} has no {sorted(missing)}")
    return cases


def _lcb_func_name(row: Mapping[str, Any]) -> str:
    value = row.get("metadata")
    meta = {} if is_missing(value) else _decoded(value, "metadata")
    name = meta.get("func_name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise TestFormatError("column 'metadata' has no 'func_name', which functional tests call")
    return name


def _json_value(text: Any, column: str, what: str) -> Any:
    if not isinstance(text, str):
        raise TestFormatError(f"column {column!r}: {what} must be JSON text, not {type(text).__name__}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TestFormatError(f"column {column!r}: {what} is not valid JSON ({e.msg})") from None


def parse_livecodebench(row: Mapping[str, Any]) -> ParsedTests:
    """LiveCodeBench `public_test_cases` + `private_test_cases` (+ `metadata` for functional tests)."""
    labelled = [
        (column, case)
        for column in FORMAT_COLUMNS["livecodebench"]
        if not is_missing(row.get(column))
        for case in _lcb_cases(row[column], column)
    ]
    kinds = {str(case["testtype"]) for _, case in labelled}
    if not kinds <= {"stdin", "functional"} or len(kinds) > 1:
        raise TestFormatError(
            f"columns 'public_test_cases'/'private_test_cases' have testtype(s) {sorted(map(str, kinds))}; "
            "one of 'stdin' or 'functional' is expected"
        )
    if kinds == {"stdin"} or not kinds:
        stdio = tuple(
            StdioCase(_text(c["input"], col, "an input"), _text(c["output"], col, "an output")) for col, c in labelled
        )
        return ParsedTests(style="stdio", cases=stdio, source="livecodebench")
    calls = tuple(
        CallCase(
            # one JSON value per input line (grade_call_based); a trailing newline adds no argument
            tuple(
                _json_value(line, col, "an input line")
                for line in _text(c["input"], col, "an input").rstrip("\n").split("\n")
            ),
            _json_value(c["output"], col, "an output"),
        )
        for col, c in labelled
    )
    return ParsedTests(
        style="call", cases=calls, entry=_lcb_func_name(row), source="livecodebench", class_name=SOLUTION_CLASS
    )


# ----------------------------------------------------------------------------- CodeContests


def parse_codecontests(row: Mapping[str, Any]) -> ParsedTests:
    """CodeContests `public_tests` + `private_tests` + `generated_tests`, all stdio."""
    cases: list[StdioCase] = []
    for column in FORMAT_COLUMNS["codecontests"]:
        if is_missing(row.get(column)):
            continue
        tests = _mapping(_decoded(row[column], column), column, "the value")
        if "input" not in tests or "output" not in tests:
            raise TestFormatError(f"column {column!r} needs 'input' and 'output' lists; it has {sorted(tests)}")
        for n, (i, o) in enumerate(_pairs(tests["input"], tests["output"], column, ("input", "output"))):
            cases.append(StdioCase(_text(i, column, f"input[{n}]"), _text(o, column, f"output[{n}]")))
    return ParsedTests(style="stdio", cases=tuple(cases), source="codecontests")


# ----------------------------------------------------------------------------- open-r1


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
        calls.append(CallCase(tuple(_sequence(args, column, f"test_cases[{n}].input (the arguments)")), expected))
    return ParsedTests(
        style="call",
        cases=tuple(calls),
        entry=next(iter(names)),
        source="open-r1",
        class_name=SOLUTION_CLASS,
        unwrap_single=True,
    )


def parse_open_r1(row: Mapping[str, Any]) -> ParsedTests:
    """open-r1 `verification_info`; a language other than Python raises, naming it."""
    column = "verification_info"
    info = _mapping(_decoded(row[column], column), column, "the value")
    language = info.get("language", "python")
    if str(language).lower() not in PYTHON_LANGUAGES:
        raise TestFormatError(f"column {column!r}: language {language!r} is not supported; only Python programs run")
    tests = _decoded(info.get("test_cases"), column)
    if isinstance(tests, dict):  # APPS-style {"inputs", "outputs"} (PrimeIntellect's RL sets), fn_name beside it
        return replace(_io_dict_tests(tests, column, info.get("fn_name")), source="open-r1")
    cases = [_mapping(c, column, f"test_cases[{n}]") for n, c in enumerate(_sequence(tests, column, "test_cases"))]
    kinds = {str(case.get("type", "stdin_stdout")) for case in cases}
    if kinds == {"function_call"}:
        return _function_call_tests(cases, column)
    if not kinds <= {"stdin_stdout"}:
        raise TestFormatError(
            f"column {column!r}: test types {sorted(map(str, kinds))}; all 'stdin_stdout' or all 'function_call' "
            "are supported"
        )
    stdio = tuple(
        StdioCase(_text(c.get("input"), column, f"test_cases[{n}].input"), _text(c.get("output"), column, "output"))
        for n, c in enumerate(cases)
    )
    return ParsedTests(style="stdio", cases=stdio, source="open-r1")


# ----------------------------------------------------------------------------- entry points

PARSERS: dict[str, Callable[[Mapping[str, Any]], ParsedTests]] = {
    "apps": parse_apps,
    "livecodebench": parse_livecodebench,
    "codecontests": parse_codecontests,
    "open-r1": parse_open_r1,
}


def detect_tests_format(row: Mapping[str, Any]) -> str | None:
    """The first format (in `FORMAT_COLUMNS` order) with a non-missing test column in `row`, or None."""
    for fmt, columns in FORMAT_COLUMNS.items():
        if any(not is_missing(row.get(c)) for c in columns):
            return fmt
    return None


def parse_tests(row: Mapping[str, Any]) -> ParsedTests | None:
    """A row's tests in the normalized form; None when the row has none of the test columns.

    Raises `TestFormatError` for malformed tests, and for a row whose columns hold no test case at all.
    """
    fmt = detect_tests_format(row)
    if fmt is None:
        return None
    parsed = PARSERS[fmt](row)
    if not parsed.cases:
        present = [c for c in FORMAT_COLUMNS[fmt] if not is_missing(row.get(c))]
        raise TestFormatError(f"column(s) {present} hold no test case")
    return parsed


def entry_expression(tests: ParsedTests, program: str) -> str | None:
    """What to call for "call" tests on `program`: `Solution().fn` when the tests allow a class and the program
    defines it at top level, else `entry` as it is (None for stdio tests)."""
    if tests.entry is None or tests.class_name is None:
        return tests.entry
    try:
        body = ast.parse(program).body
    except (SyntaxError, ValueError):  # it will fail to run anyway; the harness reports that
        return tests.entry
    if any(isinstance(node, ast.ClassDef) and node.name == tests.class_name for node in body):
        return f"{tests.class_name}().{tests.entry}"
    return tests.entry
