"""MLflow set-up shared by the stages: one tracking URI, one experiment, runs named after the recipe."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_pipeline.tasks.common import logger

if TYPE_CHECKING:  # mlflow loads when a stage talks to it, not when the flow is imported
    import mlflow


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


def tracking_uri(run_dir: str | Path) -> str:
    """MLFLOW_TRACKING_URI when set (e.g. a tracking server), else a SQLite store under the run directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def configure_mlflow(run_dir: str | Path, experiment: str) -> str:
    """Point MLflow at the store and the experiment (created if new); returns the experiment id.

    The process's tracking URI is set, not the environment: TRL's MLflow callback keeps a URI that is already set,
    and two runs with different run directories in one process keep their own stores.
    """
    import mlflow

    uri = tracking_uri(run_dir)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        # A local store keeps artifacts beside the database; a server decides for itself.
        location = (Path(run_dir).resolve() / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
        exp_id = mlflow.create_experiment(experiment, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    if exp is None or exp.tags.get(EXPERIMENT_KIND_TAG) is None:
        # MLflow 3 opens an experiment without this tag in its GenAI view (traces, evaluation runs); a training
        # pipeline's runs belong in the model-training view.
        mlflow.MlflowClient().set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


@contextlib.contextmanager
def mlflow_run(
    run_dir: str | Path, experiment: str, run_name: str, tags: dict[str, str], resume: str | None = None
) -> Iterator[mlflow.ActiveRun]:
    """Start a fresh MLflow run (ending any run left active in this thread) and end it on exit.

    `resume` names a run to continue instead (a stage resuming from its checkpoint logs on into the run it started);
    a run the store no longer has is replaced by a fresh one."""
    import mlflow
    from mlflow.exceptions import MlflowException

    configure_mlflow(run_dir, experiment)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    if resume is not None:
        try:
            active = mlflow.start_run(run_id=resume)
        except MlflowException as e:
            logger.warning("MLflow run %s cannot be continued (%s); starting a new one", resume, e)
        else:
            with active as run:
                mlflow.set_tags(tags)
                yield run
            return
    with mlflow.start_run(run_name=run_name, tags=tags) as run:
        yield run
