"""Local JSONL/JSON/Parquet/CSV files and Hugging Face datasets, mapped to the standard columns (`prompt`, `answer`,
`completion`, and the `extra_columns` rewards need); with `prompt_format: chat` a prompt is the JSON of its chat
messages (tasks/core/chat.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core import chat
from grpo_pipeline.tasks.core.chat import completion_text
from grpo_pipeline.tasks.core.hub import dataset_fix
from grpo_pipeline.tasks.core.values import is_missing
from grpo_pipeline.tasks.sources import DataError

# ----------------------------------------------------------------------------- files and HF datasets


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a .jsonl/.json/.parquet/.csv file into a DataFrame, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    try:
        if suffix in (".jsonl", ".jsonl.gz"):
            return pd.read_json(path, lines=True, dtype=False)
        if suffix in (".json", ".json.gz"):
            return pd.read_json(path, dtype=False)
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".csv", ".csv.gz"):
            return pd.read_csv(path, dtype=str, keep_default_na=False)
    except ValueError as e:
        raise DataError(f"could not read {path}: {e}") from e
    raise DataError(f"data file {path} has an unsupported extension; use .jsonl, .json, .parquet or .csv")


def load_hf(name: str, config_name: str | None, split: str) -> pd.DataFrame:
    """Load a split of a Hugging Face dataset: a hub name, a directory saved with `save_to_disk`, or a data dir."""
    import datasets

    local = Path(name)
    if (local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(local))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"dataset {name} has splits {list(ds)}, not {split!r}; set data.hf_split")
            ds = ds[split]
    elif local.exists():
        ds = datasets.load_dataset(name, config_name, split=split)
    else:
        try:
            ds = datasets.load_dataset(name, config_name, split=split)
        except (ConnectionError, FileNotFoundError) as e:  # offline and not cached, hub unreachable, no such name
            config = f" (config {config_name!r})" if config_name else ""
            raise DataError(
                f"data.hf_name {name!r}{config} cannot be fetched: {e}. {dataset_fix(name, config_name)}"
            ) from e
    return ds.to_pandas()


def map_columns(raw: pd.DataFrame, cfg: DataConfig, origin: str) -> pd.DataFrame:
    """Rename source columns to prompt/answer/completion, apply the prompt template and answer pattern."""
    wanted = [cfg.prompt_column, cfg.answer_column, *cfg.extra_columns]
    if cfg.completion_column:
        wanted.append(cfg.completion_column)
    if raw.empty:
        raise DataError(f"{origin} has no rows, so there is nothing to train on; check data.path / data.hf_name")
    missing = [c for c in wanted if c not in raw.columns]
    if missing:
        raise DataError(
            f"{origin} has no column(s) {missing}; available: {list(raw.columns)}. "
            "Map them with data.prompt_column / data.answer_column / data.extra_columns."
        )
    out = pd.DataFrame(index=raw.index)
    out["prompt"] = [format_prompt(cfg, v, origin) for v in raw[cfg.prompt_column]]
    answers = raw[cfg.answer_column].map(lambda v: None if is_missing(v) else str(v))
    if cfg.answer_pattern:
        pattern = re.compile(cfg.answer_pattern, re.MULTILINE | re.DOTALL)
        answers = answers.map(lambda v: _extract(pattern, v))
    out["answer"] = answers
    out["completion"] = (
        raw[cfg.completion_column].map(lambda v: None if is_missing(v) else _target_text(chat.plain(v), origin, cfg))
        if cfg.completion_column
        else out["answer"]
    )
    for c in cfg.extra_columns:
        out[c] = _as_json_if_nested(raw[c])
    return out.reset_index(drop=True)


def _as_json_if_nested(column: pd.Series) -> pd.Series:
    """A column holding mappings or lists of containers, as JSON text (missing values and strings unchanged).

    Test columns of code datasets (APPS `input_output`, CodeContests `public_tests`, open-r1 `verification_info`)
    are such columns: decoded, their rows mix shapes (lists of strings, of lists) that one Parquet column cannot
    hold; as JSON they are the text these datasets publish, which the code_tests reward reads as well.
    """
    values = [None if is_missing(v) or isinstance(v, str) else chat.plain(v) for v in column]
    nested = any(
        isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, dict | list) for x in v)) for v in values
    )
    if not nested:
        return column
    return pd.Series(
        [v if p is None else json.dumps(p) for v, p in zip(column, values, strict=True)], index=column.index
    )


def _target_text(value: Any, origin: str, cfg: DataConfig) -> str:
    """An SFT target as text: a string, or chat messages' last content, read as the rewards read a completion
    (`completion_text`), so SFT trains on the text they score; any other scalar (a number in a CSV column) its str."""
    if not isinstance(value, list | dict):
        return str(value)
    try:
        return completion_text(value)
    except TypeError:
        raise DataError(
            f"{origin}: column {cfg.completion_column!r} holds {value!r}, which is neither text nor chat messages; "
            "give the SFT target as a string or as [{'role': 'assistant', 'content': ...}]"
        ) from None


def format_prompt(cfg: DataConfig, value: Any, origin: str = "the data") -> str | None:
    """One row's prompt as stored in the splits: the templated question (prompt_format: text), or the JSON of its
    chat messages (prompt_format: chat; tasks/core/chat.py). A source value that already holds messages is kept as it
    is (the system prompt put first when it has none), and validation checks it."""
    if is_missing(value):
        return None
    value = chat.plain(value)
    holds_messages = isinstance(value, list)
    if cfg.prompt_format == "text":
        if holds_messages:
            raise DataError(
                f"{origin}: column {cfg.prompt_column!r} holds chat messages, not text; set data.prompt_format=chat"
            )
        return cfg.prompt_template.format(prompt=value)
    if not holds_messages:
        return chat.encode_messages(chat.build_messages(cfg.prompt_template.format(prompt=value), cfg.system_prompt))
    first = value[0] if value else None
    if cfg.system_prompt and not (isinstance(first, dict) and first.get("role") == "system"):
        value = [{"role": "system", "content": cfg.system_prompt}, *value]
    return chat.encode_messages(value)


def _extract(pattern: re.Pattern, value: str | None) -> str | None:
    if value is None:
        return None
    m = pattern.search(value)
    return m.group(1).strip().replace(",", "") if m else None
