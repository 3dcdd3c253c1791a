"""The base model: the embedded tiny model, a local directory, a registered MLflow model version, or a hub name.

A registered version (`models:/<name>@<alias>` or `models:/<name>/<version>`) is downloaded from the MLflow
tracking server; scheduled retraining continues from `models:/<name>@champion` this way. A version's files never
change in MLflow, so the version it resolves to (name, number, run, source) keys the stage: a new champion
reruns everything after it, an unchanged one hits the cache.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import ModelConfig
from grpo_pipeline.tasks.core.common import Checkpoint, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.core.tracking import tracking_uri, use_store

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion


REGISTRY_PREFIX = "models:/"


def _base_identity(params: Mapping[str, Any]) -> dict[str, str]:
    """A local directory is keyed by its content, a registered model by the version it resolves to now."""
    base: str = params["cfg"].base
    if base.startswith(REGISTRY_PREFIX):
        version = resolve_registered(base, params["run_dir"])
        return {"base": f"{version.name}/{version.version}:{version.run_id}:{version.source}"}
    if base != "tiny" and Path(base).is_dir():
        return {"base": fingerprint_path(base)}
    return {}


def resolve_registered(uri: str, run_dir: str) -> ModelVersion:
    """The MLflow model version `models:/<name>@<alias>` or `models:/<name>/<version>` names, with a clear error."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    ref = uri.removeprefix(REGISTRY_PREFIX)
    name, alias = ref.split("@", 1) if "@" in ref else (ref, None)
    name, _, number = name.partition("/") if alias is None else (name, "", "")
    if not name or not (alias or number.isdigit()):
        raise ValueError(f"model.base {uri!r} is not models:/<name>@<alias> or models:/<name>/<version>")
    client = MlflowClient(tracking_uri=tracking_uri(run_dir))
    try:
        return client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, number)
    except MlflowException as e:
        raise FileNotFoundError(
            f"model.base {uri!r}: no such registered model version at {tracking_uri(run_dir)} ({e.message}); "
            "check the name and alias (`champion` exists after the first registration) or MLFLOW_TRACKING_URI"
        ) from None


def looks_local(base: str) -> bool:
    """Whether `model.base` names a directory on this machine rather than a hub model: a hub name is `name` or
    `org/name` (one slash at most, never a leading `/`, `.` or `~`)."""
    return not base.startswith(REGISTRY_PREFIX) and (
        base.startswith(("/", ".", "~")) or base.count("/") > 1 or "\\" in base or Path(base).exists()
    )


def check_base_path(base: str) -> None:
    """Raise FileNotFoundError when `model.base` is a local path that is not a saved Hugging Face model directory.

    Without this a missing directory would be taken for a hub name and fail only when SFT loads it."""
    if base == "tiny" or not looks_local(base):
        return
    local = Path(base)
    if not local.is_dir():
        raise FileNotFoundError(
            f"model.base {base!r} does not exist (or is not a directory); set model.base to the directory of a saved "
            "Hugging Face model (config.json, weights, tokenizer), 'tiny', a hub name or models:/<name>@<alias>"
        )
    if not (local / "config.json").exists():
        raise FileNotFoundError(
            f"model.base {base!r} is a directory without config.json; point it at a model saved with "
            "save_pretrained (model and tokenizer)"
        )


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
        from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

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


def fetch_registered(version: ModelVersion, run_dir: str, out: Path) -> Path:
    """A registered version as a plain Hugging Face directory (model + tokenizer) in `out`, written atomically.

    Versions are MLflow transformers models (an `MLmodel` with the model and its tokenizer as components); a
    version that is a bare model directory (config.json at its root) is copied as it is.
    """
    import mlflow

    pinned = f"{REGISTRY_PREFIX}{version.name}/{version.version}"
    use_store(run_dir)
    with atomic_dir(out) as tmp:
        downloaded = Path(mlflow.artifacts.download_artifacts(artifact_uri=pinned, dst_path=str(tmp / "download")))
        if (downloaded / "MLmodel").exists():
            parts = mlflow.transformers.load_model(str(downloaded), return_type="components")
            parts["model"].save_pretrained(tmp)
            parts["tokenizer"].save_pretrained(tmp)
        elif (downloaded / "config.json").exists():
            for item in downloaded.iterdir():
                shutil.move(str(item), tmp / item.name)
        else:
            raise FileNotFoundError(f"{pinned} is neither an MLflow transformers model nor a saved Hugging Face model")
        shutil.rmtree(tmp / "download", ignore_errors=True)
    return out
