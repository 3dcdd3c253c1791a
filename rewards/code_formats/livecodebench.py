"""LiveCodeBench: `public_test_cases`, `private_test_cases` (often compressed) and `metadata`'s func_name."""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from typing import Any

from grpo_pipeline.rewards.code_formats.cases import (
    MAX_DECOMPRESSED_BYTES,
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
    plain,
)
from grpo_pipeline.tasks.core.values import is_blank

TEST_COLUMNS = ("public_test_cases", "private_test_cases")


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
            value = decoded(decode_private_blob(value, column), column)
    cases = as_sequence(plain(value), column, "the test cases")
    for n, case in enumerate(cases):
        as_mapping(case, column, f"case {n}")
        missing = {"input", "output", "testtype"} - set(case)
        if missing:
            raise TestFormatError(f"column {column!r}: case {n} has no {sorted(missing)}")
    return cases


def _lcb_func_name(row: Mapping[str, Any]) -> str:
    value = row.get("metadata")
    meta = {} if is_blank(value) else decoded(value, "metadata")
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
        for column in TEST_COLUMNS
        if not is_blank(row.get(column))
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
            StdioCase(as_text(c["input"], col, "an input"), as_text(c["output"], col, "an output"))
            for col, c in labelled
        )
        return ParsedTests(style="stdio", cases=stdio)
    calls = tuple(
        CallCase(
            # one JSON value per input line (grade_call_based); a trailing newline adds no argument
            tuple(
                _json_value(line, col, "an input line")
                for line in as_text(c["input"], col, "an input").rstrip("\n").split("\n")
            ),
            _json_value(c["output"], col, "an output"),
        )
        for col, c in labelled
    )
    return ParsedTests(style="call", cases=calls, entry=_lcb_func_name(row), class_name=SOLUTION_CLASS)


LIVECODEBENCH = CodeFormat(
    name="livecodebench",
    test_columns=TEST_COLUMNS,
    parse=parse_livecodebench,
    stdout_rule="livecodebench",
    statement_columns=("question_content",),
    id_column="question_id",  # no reference solution is published
)
