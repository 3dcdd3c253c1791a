"""A registered model version (`models:/<name>@<alias>` or `models:/<name>/<version>`): resolved to the version it
names now, and downloaded as a plain Hugging Face directory. The base-model stage starts from one (scheduled
retraining from `models:/<name>@champion`), the gate scores the champion with one, and `grpo-pipeline eval` scores
any."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_pipeline.tasks.core.common import atomic_dir
from grpo_pipeline.tasks.core.tracking import REGISTRY_PREFIX, tracking_uri, use_store

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion


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
