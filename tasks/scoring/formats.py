"""Eval formats: the registry of benchmark formats, which format a table is in (by its columns), the reward that
judges it, and loading its rows through the format's mapper (tasks/scoring/adapters.py, which describes each format).

Each format is one `EvalFormat`, registered once in `EVAL_FORMATS`: its name, the column sets that identify it, the
registered reward that decides correctness, its mapper and, for the stdin/stdout and call-based code formats, its
`CodeFormat` (test columns, parser, stdout rule). Those code formats are declared in rewards/code_formats/
(`CODE_FORMATS`), where the code reward reads them too, since rewards/ must not import tasks/; their entries here are
built from those declarations. So adding a code format is one `CodeFormat` there, and adding any other format one
`EvalFormat` below, with its mapper in adapters.py.

Detection tries the formats in this order, first match wins: humaneval, mbpp, apps, codecontests, livecodebench,
open-r1, gsm8k, boxed, columns. HumanEval and MBPP rows also have a `prompt`, and MATH-500 rows also have an
`answer`, so the specific formats come before the generic `columns`; the code formats come before gsm8k and boxed,
whose `question` / `problem` columns their derived tables may carry too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from grpo_pipeline.configs.eval import CORRECTNESS
from grpo_pipeline.configs.grpo import RewardSpec
from grpo_pipeline.rewards.code_formats import CODE_FORMATS, CodeFormat
from grpo_pipeline.tasks.scoring.adapters import (
    map_boxed,
    map_code_io,
    map_gsm8k,
    map_humaneval,
    map_mbpp,
    map_passthrough,
)
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.tables import read_table

Mapper = Callable[[pd.DataFrame, str], pd.DataFrame]  # (raw rows, where they came from) -> the eval columns

# The rewards that decide whether a completion is correct: the math answer check (configs/eval.py's default, from
# there) and running the problem's tests (rewards/code.py).
CODE_TESTS = RewardSpec(name="code_tests")


@dataclass(frozen=True)
class EvalFormat:
    """One benchmark format: a table is in it when all columns of one of `signatures` are present; `mapper` turns its
    rows into the eval columns, and `correctness_reward` scores a completion 1.0 when it is correct for them. `code`
    is the stdin/stdout or call-based code format it is built from (rewards/code_formats/), or None."""

    name: str
    signatures: tuple[frozenset[str], ...]
    correctness_reward: RewardSpec
    mapper: Mapper
    code: CodeFormat | None = None

    @classmethod
    def of_code(cls, code: CodeFormat) -> EvalFormat:
        """The eval format of a code format: its own signatures, judged by running its tests, mapped by its spec."""
        return cls(code.name, code.signatures, CODE_TESTS, functools.partial(map_code_io, code), code)


# The registry, in detection order (the module docstring says why).
EVAL_FORMATS: tuple[EvalFormat, ...] = (
    EvalFormat("humaneval", (frozenset({"prompt", "test", "entry_point"}),), CODE_TESTS, map_humaneval),
    EvalFormat("mbpp", (frozenset({"text", "test_list"}), frozenset({"prompt", "test_list"})), CODE_TESTS, map_mbpp),
    *(EvalFormat.of_code(code) for code in CODE_FORMATS),
    EvalFormat("gsm8k", (frozenset({"question", "answer"}),), CORRECTNESS, map_gsm8k),
    EvalFormat("boxed", (frozenset({"problem", "solution"}), frozenset({"problem", "answer"})), CORRECTNESS, map_boxed),
    EvalFormat("columns", (frozenset({"prompt", "answer"}),), CORRECTNESS, map_passthrough),
)
FORMATS: tuple[str, ...] = tuple(fmt.name for fmt in EVAL_FORMATS)
_BY_NAME: dict[str, EvalFormat] = {fmt.name: fmt for fmt in EVAL_FORMATS}


def _known_formats() -> str:
    return "; ".join(f"{fmt.name} ({' | '.join(', '.join(sorted(s)) for s in fmt.signatures)})" for fmt in EVAL_FORMATS)


def detect_format(columns: Iterable[str], origin: str = "the table") -> str:
    """The name of the first format (in `EVAL_FORMATS` order) whose identifying columns are all present."""
    seen = {str(c) for c in columns}
    for fmt in EVAL_FORMATS:
        if any(signature <= seen for signature in fmt.signatures):
            return fmt.name
    raise DataError(
        f"{origin} has columns {sorted(seen)}, which match no known eval format. Known formats and the columns "
        f"they need: {_known_formats()}. Rename the columns, or map them to prompt/answer first."
    )


def correctness_reward_for(fmt: str) -> RewardSpec:
    """The registered reward that scores a completion 1.0 when it is correct for rows of format `fmt`."""
    if fmt not in _BY_NAME:
        raise DataError(f"unknown eval format {fmt!r}; known: {list(FORMATS)}")
    return _BY_NAME[fmt].correctness_reward


def _check_columns(raw: pd.DataFrame, fmt: EvalFormat, origin: str) -> None:
    """Every column of one of `fmt`'s signatures is present (an explicit `fmt` skips detection)."""
    if any(signature <= set(raw.columns) for signature in fmt.signatures):
        return
    missing = sorted(min((s - set(raw.columns) for s in fmt.signatures), key=len))
    raise DataError(
        f"{origin} has no column(s) {missing}, which format {fmt.name!r} needs; columns seen: {list(raw.columns)}. "
        f"Rename them, or pass fmt='auto' to detect the format ({_known_formats()})."
    )


def _read(source: str | Path | pd.DataFrame) -> tuple[pd.DataFrame, str]:
    if isinstance(source, pd.DataFrame):
        return source, "the eval DataFrame"
    return read_table(source), f"eval file {source}"


def load_eval_rows(
    source: str | Path | pd.DataFrame, fmt: str = "auto", limit: int | None = None
) -> tuple[pd.DataFrame, str]:
    """Rows of a benchmark file (.jsonl[.gz]/.json/.parquet/.csv) or DataFrame, mapped to the eval columns.

    `fmt="auto"` detects the format from the column names (`detect_format`); `limit` keeps the first rows only, and
    only those are checked. Returns the mapped rows (index 0..n-1) and the name of the format used.
    """
    raw, origin = _read(source)
    if fmt != "auto" and fmt not in _BY_NAME:
        raise DataError(f"unknown eval format {fmt!r}; use 'auto' or one of {list(FORMATS)}")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be at least 1 (or None for every row), got {limit}")
    if raw.empty:
        raise DataError(f"{origin} has no rows")
    if fmt == "auto":
        fmt = detect_format(raw.columns, origin)
    else:
        _check_columns(raw, _BY_NAME[fmt], origin)
    raw = raw.head(limit).reset_index(drop=True) if limit else raw.reset_index(drop=True)
    return _BY_NAME[fmt].mapper(raw, origin), fmt
