"""The base model: the embedded tiny model, a local directory, a registered MLflow model version, or a hub name.

A registered version (`models:/<name>@<alias>` or `models:/<name>/<version>`) is downloaded from the MLflow
tracking server; scheduled retraining continues from `models:/<name>@champion` this way. A version's files never
change in MLflow, so the version it resolves to (name, number, run, source) keys the stage: a new champion
reruns everything after it, an unchanged one hits the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import ModelConfig
from grpo_pipeline.tasks.core.common import Checkpoint, fingerprint_path, logger
from grpo_pipeline.tasks.core.hub import check_base_path
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.core.tracking import REGISTRY_PREFIX
from grpo_pipeline.tasks.release.registered import fetch_registered, resolve_registered


def _base_identity(params: Mapping[str, Any]) -> dict[str, str]:
    """A local directory is keyed by its content, a registered model by the version it resolves to now."""
    base: str = params["cfg"].base
    if base.startswith(REGISTRY_PREFIX):
        version = resolve_registered(base, params["run_dir"])
        return {"base": f"{version.name}/{version.version}:{version.run_id}:{version.source}"}
    if base != "tiny" and Path(base).is_dir():
        return {"base": fingerprint_path(base)}
    return {}


def pin_registered(cfg: ModelConfig, run_dir: str) -> ModelConfig:
    """`cfg` with a `models:/<name>@<alias>` base resolved to the version the alias names now, so the stage's key and
    its download cannot see two different versions when the alias moves in between."""
    if not (cfg.base.startswith(REGISTRY_PREFIX) and "@" in cfg.base):
        return cfg
    version = resolve_registered(cfg.base, run_dir)
    logger.info("model.base %s is %s version %s", cfg.base, version.name, version.version)
    return cfg.model_copy(update={"base": f"{REGISTRY_PREFIX}{version.name}/{version.version}"})


@stage("base", external=_base_identity)
def prepare_base_model(cfg: ModelConfig, run_dir: str, seed: int, out: Path) -> Checkpoint:
    """A Checkpoint for the configured base model, building the tiny model into `out` when `base` is 'tiny'."""
    if cfg.base == "tiny":
        from grpo_pipeline.tasks.training.tiny_model import build_tiny_model  # torch and transformers: when built

        build_tiny_model(cfg.tiny, out, seed)
        logger.info("built the embedded tiny model in %s", out)
        return Checkpoint(path=str(out), fingerprint=fingerprint_path(out), parent="tiny", stage="base")
    if cfg.base.startswith(REGISTRY_PREFIX):
        return _download_registered(cfg.base, run_dir, out)
    check_base_path(cfg.base)
    local = Path(cfg.base)
    if local.is_dir():
        return Checkpoint(path=str(local.resolve()), fingerprint=fingerprint_path(local), parent=cfg.base, stage="base")
    # A hub model: its name is its identity (a revision pin belongs in the name's cache, not here).
    return Checkpoint(path=cfg.base, fingerprint=f"hub:{cfg.base}", parent=cfg.base, stage="base")


def _download_registered(uri: str, run_dir: str, out: Path) -> Checkpoint:
    version = resolve_registered(uri, run_dir)
    pinned = f"{REGISTRY_PREFIX}{version.name}/{version.version}"
    fetch_registered(version, run_dir, out)
    logger.info("downloaded %s (%s) into %s", pinned, uri, out)
    return Checkpoint(path=str(out), fingerprint=fingerprint_path(out), parent=pinned, stage="base")
