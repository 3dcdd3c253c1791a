"""The base model: the embedded tiny model, a local directory, or a hub name (loaded with from_pretrained)."""

from __future__ import annotations

from pathlib import Path

from grpo_pipeline.configs.schema import ModelConfig, section_hash
from grpo_pipeline.tasks.common import Checkpoint, fingerprint_path, logger, stage_dir
from grpo_pipeline.tasks.tiny_model import build_tiny_model


def prepare_base_model(cfg: ModelConfig, run_dir: str, seed: int) -> Checkpoint:
    """A Checkpoint for the configured base model, building the tiny model when `base` is 'tiny'."""
    if cfg.base == "tiny":
        out = stage_dir(run_dir, "base", section_hash({"tiny": cfg.tiny.model_dump(), "seed": seed}))
        if not (out / "config.json").exists():
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
