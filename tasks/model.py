"""The base model: the embedded tiny model, a local directory, or a hub name (loaded with from_pretrained)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import ModelConfig
from grpo_pipeline.tasks.common import Checkpoint, fingerprint_path, logger
from grpo_pipeline.tasks.stage import stage
from grpo_pipeline.tasks.tiny_model import build_tiny_model


def _local_base(params: Mapping[str, Any]) -> dict[str, str]:
    """A local base model is keyed by its content, so a changed directory reruns everything after it."""
    base = Path(params["cfg"].base)
    return {"base": fingerprint_path(base)} if params["cfg"].base != "tiny" and base.is_dir() else {}


@stage("base", external=_local_base)
def prepare_base_model(cfg: ModelConfig, run_dir: str, seed: int, out: Path) -> Checkpoint:
    """A Checkpoint for the configured base model, building the tiny model into `out` when `base` is 'tiny'."""
    if cfg.base == "tiny":
        build_tiny_model(cfg.tiny, out, seed)
        logger.info("built the embedded tiny model in %s", out)
        return Checkpoint(path=str(out), fingerprint=fingerprint_path(out), parent="tiny", stage="base")
    local = Path(cfg.base)
    if local.is_dir():
        if not (local / "config.json").exists():
            raise FileNotFoundError(f"model.base {local} is a directory without config.json; is it a saved HF model?")
        return Checkpoint(path=str(local.resolve()), fingerprint=fingerprint_path(local), parent=cfg.base, stage="base")
    # A hub model: its name is its identity (a revision pin belongs in the name's cache, not here).
    return Checkpoint(path=cfg.base, fingerprint=f"hub:{cfg.base}", parent=cfg.base, stage="base")
