"""Stage 2, validate_data: the prepared splits checked against the data contract (tasks/sources/contract.py), all
together so that the contract can see across them; nothing downstream runs on bad data."""

from __future__ import annotations

import pandas as pd

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core.common import DatasetRefs
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.sources.contract import validate_frames


@stage("validate")
def validate_data(refs: DatasetRefs, cfg: DataConfig) -> DatasetRefs:
    """Validate the prepared Parquet files; returns the same refs so the flow can chain on success."""
    probe = pd.read_parquet(refs.probe.require()) if refs.probe is not None else None
    validate_frames(pd.read_parquet(refs.train.require()), pd.read_parquet(refs.eval.require()), cfg, probe)
    return refs
