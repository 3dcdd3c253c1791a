"""Loading a configured source (a built-in synthetic task, a local file, a Hugging Face dataset) into the standard
columns: what the data stage and the evaluation suites both read their rows with."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from grpo_pipeline.configs.data import DataConfig
from grpo_pipeline.tasks.core.common import fingerprint_path
from grpo_pipeline.tasks.sources.synthetic import synthetic_arithmetic, synthetic_functions
from grpo_pipeline.tasks.sources.tables import format_prompt, load_hf, map_columns, read_table
from grpo_pipeline.tasks.sources.tool_tasks import tool_arithmetic

# data.synthetic.kind -> the generator of its rows
SYNTHETIC_KINDS = {
    "arithmetic": synthetic_arithmetic,
    "functions": synthetic_functions,
    "tool_arithmetic": tool_arithmetic,
}


def describe_source(cfg: DataConfig) -> str:
    """The configured source in words, for error messages."""
    if cfg.source == "file":
        return f"data file {cfg.path}"
    if cfg.source == "hf":
        return f"dataset {cfg.hf_name} (split {cfg.hf_split!r})"
    return "the synthetic task"


def load_source(cfg: DataConfig) -> pd.DataFrame:
    """All rows of the configured source, mapped to the standard columns."""
    if cfg.source == "synthetic":
        make = SYNTHETIC_KINDS[cfg.synthetic.kind]
        df = make(cfg.synthetic, cfg.num_train + cfg.num_eval + cfg.num_probe, cfg.seed)
        df["prompt"] = [format_prompt(cfg, p) for p in df["prompt"]]
        if "completion" not in df:  # a generator may write SFT targets of its own (a teacher's tool calls)
            df["completion"] = df["answer"]
        return df
    if cfg.source == "file":
        return map_columns(read_table(cfg.path), cfg, origin=describe_source(cfg))
    return map_columns(load_hf(cfg.hf_name, cfg.hf_config, cfg.hf_split), cfg, origin=describe_source(cfg))


def source_content(params: Mapping[str, Any]) -> dict[str, str]:
    """A local source file or dataset directory is keyed by its content: fixing a bad row in place and rerunning
    must prepare the data again, not reuse the splits of the old file."""
    cfg: DataConfig = params["cfg"]
    local = cfg.path if cfg.source == "file" else cfg.hf_name if cfg.source == "hf" else None
    if local and Path(local).exists():
        return {"source": fingerprint_path(local)}
    return {}
