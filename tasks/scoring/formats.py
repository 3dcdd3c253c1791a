"""Eval formats: which known benchmark format a table is in (by its columns), the reward that judges it, and
loading its rows through the format's adapter (tasks/scoring/adapters.py, which lists the formats and their columns).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal, get_args

import pandas as pd

from grpo_pipeline.tasks.scoring.adapters import (
    map_apps,
    map_boxed,
    map_codecontests,
    map_gsm8k,
    map_humaneval,
    map_livecodebench,
    map_mbpp,
    map_open_r1,
    map_passthrough,
)
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.tables import read_table

EvalFormat = Literal[
    "gsm8k", "boxed", "humaneval", "mbpp", "apps", "codecontests", "livecodebench", "open-r1", "columns"
]


FORMATS: tuple[EvalFormat, ...] = get_args(EvalFormat)

# Column sets that identify each format, tried in this order (first match wins): HumanEval and MBPP rows also have a
# `prompt`, and MATH-500 rows also have an `answer`, so the specific formats come before the generic `columns`; the
# code formats come before gsm8k and boxed, whose `question` / `problem` columns their derived tables may carry too.
SIGNATURES: dict[EvalFormat, tuple[frozenset[str], ...]] = {
    "humaneval": (frozenset({"prompt", "test", "entry_point"}),),
    "mbpp": (frozenset({"text", "test_list"}), frozenset({"prompt", "test_list"})),
    "apps": (frozenset({"question", "input_output"}),),
    "codecontests": (frozenset({"description", "public_tests"}),),
    "livecodebench": (frozenset({"question_content", "public_test_cases"}),),
    "open-r1": tuple(frozenset({column, "verification_info"}) for column in ("problem_statement", "problem", "prompt")),
    "gsm8k": (frozenset({"question", "answer"}),),
    "boxed": (frozenset({"problem", "solution"}), frozenset({"problem", "answer"})),
    "columns": (frozenset({"prompt", "answer"}),),
}

# Names in the reward registry (rewards/registry.py) that decide whether a completion is correct.
CORRECTNESS_REWARDS: dict[EvalFormat, str] = {
    "gsm8k": "correctness",
    "boxed": "correctness",
    "columns": "correctness",
    "humaneval": "code_tests",
    "mbpp": "code_tests",
    "apps": "code_tests",
    "codecontests": "code_tests",
    "livecodebench": "code_tests",
    "open-r1": "code_tests",
}


def _known_formats() -> str:
    return "; ".join(f"{fmt} ({' | '.join(', '.join(sorted(s)) for s in SIGNATURES[fmt])})" for fmt in FORMATS)


def detect_format(columns: Iterable[str], origin: str = "the table") -> EvalFormat:
    """The first format (in `SIGNATURES` order) whose identifying columns are all present."""
    seen = {str(c) for c in columns}
    for fmt, signatures in SIGNATURES.items():
        if any(signature <= seen for signature in signatures):
            return fmt
    raise DataError(
        f"{origin} has columns {sorted(seen)}, which match no known eval format. Known formats and the columns "
        f"they need: {_known_formats()}. Rename the columns, or map them to prompt/answer first."
    )


def correctness_reward_for(fmt: EvalFormat) -> str:
    """The registered reward that scores a completion 1.0 when it is correct for rows of format `fmt`."""
    if fmt not in CORRECTNESS_REWARDS:
        raise DataError(f"unknown eval format {fmt!r}; known: {list(FORMATS)}")
    return CORRECTNESS_REWARDS[fmt]


def _check_columns(raw: pd.DataFrame, fmt: EvalFormat, origin: str) -> None:
    """Every column of one of `fmt`'s signatures is present (an explicit `fmt` skips detection)."""
    signatures = SIGNATURES[fmt]
    if any(signature <= set(raw.columns) for signature in signatures):
        return
    missing = sorted(min((s - set(raw.columns) for s in signatures), key=len))
    raise DataError(
        f"{origin} has no column(s) {missing}, which format {fmt!r} needs; columns seen: {list(raw.columns)}. "
        f"Rename them, or pass fmt='auto' to detect the format ({_known_formats()})."
    )


MAPPERS: dict[EvalFormat, Callable[[pd.DataFrame, str], pd.DataFrame]] = {
    "gsm8k": map_gsm8k,
    "boxed": map_boxed,
    "humaneval": map_humaneval,
    "mbpp": map_mbpp,
    "apps": map_apps,
    "codecontests": map_codecontests,
    "livecodebench": map_livecodebench,
    "open-r1": map_open_r1,
    "columns": map_passthrough,
}


def _read(source: str | Path | pd.DataFrame) -> tuple[pd.DataFrame, str]:
    if isinstance(source, pd.DataFrame):
        return source, "the eval DataFrame"
    return read_table(source), f"eval file {source}"


def load_eval_rows(
    source: str | Path | pd.DataFrame, fmt: EvalFormat | Literal["auto"] = "auto", limit: int | None = None
) -> tuple[pd.DataFrame, EvalFormat]:
    """Rows of a benchmark file (.jsonl[.gz]/.json/.parquet/.csv) or DataFrame, mapped to the eval columns.

    `fmt="auto"` detects the format from the column names (`detect_format`); `limit` keeps the first rows only, and
    only those are checked. Returns the mapped rows (index 0..n-1) and the format used.
    """
    raw, origin = _read(source)
    if fmt != "auto" and fmt not in FORMATS:
        raise DataError(f"unknown eval format {fmt!r}; use 'auto' or one of {list(FORMATS)}")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be at least 1 (or None for every row), got {limit}")
    if raw.empty:
        raise DataError(f"{origin} has no rows")
    if fmt == "auto":
        fmt = detect_format(raw.columns, origin)
    else:
        _check_columns(raw, fmt, origin)
    raw = raw.head(limit).reset_index(drop=True) if limit else raw.reset_index(drop=True)
    return MAPPERS[fmt](raw, origin), fmt
