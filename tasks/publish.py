"""Checkpoints across machines: publish a model directory to the MLflow artifact store, fetch it back by URI.

A GRPO round that runs on another work pool (`grpo.work_pool`) publishes its checkpoint to its own MLflow run; the
tracking server proxies artifacts (`mlflow server --serve-artifacts`), so the pipeline and the evaluator fetch it
over HTTP where the path is not on their disk. The content fingerprint is checked after every fetch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from grpo_pipeline.tasks.common import Checkpoint, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.tracking import configure_mlflow, tracking_uri

ARTIFACT_PATH = "checkpoint"


def publish(ckpt: Checkpoint, run_dir: str, experiment: str) -> Checkpoint:
    """Log the checkpoint's directory to its MLflow run; returns the checkpoint with `uri` set."""
    import mlflow

    if ckpt.run_id is None:
        raise ValueError(f"{ckpt.path} has no MLflow run to publish it to")
    configure_mlflow(run_dir, experiment)
    client = mlflow.MlflowClient()
    client.log_artifacts(ckpt.run_id, ckpt.require(), ARTIFACT_PATH)
    uri = f"runs:/{ckpt.run_id}/{ARTIFACT_PATH}"
    logger.info("published %s to %s", ckpt.path, uri)
    return ckpt.model_copy(update={"uri": uri})


def materialize(ckpt: Checkpoint, run_dir: str) -> Checkpoint:
    """The checkpoint with a local path: itself when its directory is here, else a verified download of its `uri`."""
    import mlflow

    if Path(ckpt.path).is_dir():
        return ckpt
    if ckpt.uri is None:
        raise FileNotFoundError(f"{ckpt.path} is not on this machine and was not published to MLflow")
    mlflow.set_tracking_uri(tracking_uri(run_dir))
    out = Path(run_dir).resolve() / "fetched" / ckpt.fingerprint[:12]
    if not (out.is_dir() and fingerprint_path(out) == ckpt.fingerprint):
        with atomic_dir(out) as tmp:
            downloaded = mlflow.artifacts.download_artifacts(artifact_uri=ckpt.uri, dst_path=str(tmp / "dl"))
            for item in Path(downloaded).iterdir():
                shutil.move(str(item), tmp / item.name)
            shutil.rmtree(tmp / "dl", ignore_errors=True)
            got = fingerprint_path(tmp)
            if got != ckpt.fingerprint:
                raise ValueError(f"{ckpt.uri} has fingerprint {got[:12]}, expected {ckpt.fingerprint[:12]}")
        logger.info("fetched %s into %s", ckpt.uri, out)
    return ckpt.model_copy(update={"path": str(out)})
