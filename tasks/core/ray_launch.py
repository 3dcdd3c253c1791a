"""Training stages as Ray Train jobs (`distributed.backend: ray`), on workers that may sit on other machines.

A stage decorated with `@launched` (tasks/core/launch.py) whose run context says `backend: ray` is sent as the same
job a multi-process launch writes to its job file (module, stage, arguments as JSON) to `ray.train.torch.TorchTrainer`
with `distributed.num_workers` workers of `distributed.resources_per_worker` each, on the cluster at
`distributed.ray_address` or on a local one started for the run. Ray Train initializes torch.distributed (gloo on
CPU, NCCL on GPUs) and sets RANK, WORLD_SIZE and LOCAL_RANK, so inside each worker the stage trains exactly as in a
launched process: TRL's trainer with each worker's share of the global batch, worker 0 alone logging to MLflow and
saving, and one decision for all workers (tasks/training/consensus.py).

The workers share no disk with the pipeline or each other; everything travels through MLflow's artifact store, as
for a GRPO round on another work pool (flows/grpo_train.py, tasks/core/publish.py):
  - the stage's inputs (checkpoints, data files) are published before the job starts and fetched by each worker
    that does not have them;
  - periodic checkpoints are mirrored to worker 0's MLflow run, and a rerun of a killed job resumes from the newest
    one (tasks/training/checkpoint_mirror.py);
  - worker 0 publishes the trained checkpoint and leaves its description under a token the pipeline chose
    (`hand_over`), which the pipeline reads back (`take_over`).
Every worker writes into the output folder the pipeline computed, so the stage keeps one key and one folder.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import ConfigError
from grpo_pipeline.tasks.core.common import Checkpoint, logger
from grpo_pipeline.tasks.core.jobs import LAUNCH_ID_ENV, is_main_process, job_spec
from grpo_pipeline.tasks.core.publish import hand_over, publish, take_over
from grpo_pipeline.tasks.core.ray_cluster import connect, shared_inputs, start_worker, where, worker_env
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import configure_mlflow

# Set in the workers of a Ray Train job: their periodic checkpoints travel through MLflow
# (tasks/training/checkpoint_mirror.py), since the workers share no disk with each other or the pipeline.
MIRROR_ENV = "GRPO_PIPELINE_CHECKPOINTS_IN_MLFLOW"


def ray_launch(fn: Callable[..., Checkpoint], params: dict[str, Any], ctx: RunContext) -> Checkpoint:
    """Train the stage `fn` as a Ray Train job and return the checkpoint its worker 0 saved, fetched here where its
    path is not."""
    try:
        from ray.train import FailureConfig, RunConfig, TrainingFailedError
        from ray.train.torch import TorchTrainer
    except ImportError as e:
        raise ConfigError(
            f"distributed.backend is ray but Ray Train cannot be imported here ({e}): pip install -e '.[ray]' "
            "(ray[train]==2.60.0), or set distributed.backend=accelerate"
        ) from e
    out = Path(params["out"]).resolve()
    inputs = shared_inputs({k: v for k, v in params.items() if k != "out"}, ctx, out.parent.name)
    handoff = uuid.uuid4().hex  # names the stage's result in MLflow
    job = {**job_spec(fn, inputs), "out": str(out), "handoff": handoff, "launch_id": handoff[:8]}
    configure_mlflow(ctx.run_dir, ctx.experiment)  # the experiment exists before any worker logs to it
    connect(ctx)
    trainer = TorchTrainer(
        train_worker,
        train_loop_config=job,
        scaling_config=scaling_config(ctx),
        # No retry inside the job: a rerun of the stage (or a Prefect retry) resumes from the mirrored checkpoint.
        run_config=RunConfig(
            name=f"{out.parent.name}-{handoff[:8]}",
            failure_config=FailureConfig(max_failures=0),
            worker_runtime_env={"env_vars": worker_env(ctx)},
        ),
    )
    logger.info("%s: training as a Ray Train job of %d workers (%s)", fn.__name__, ctx.num_processes, where(ctx))
    try:
        trainer.fit()
    except TrainingFailedError as e:
        raise RuntimeError(
            f"{fn.__name__} as a Ray Train job of {ctx.num_processes} workers failed ({e}); its workers' errors are "
            "in the log above. A rerun resumes from its last checkpoint mirrored in MLflow (grpo.save_every_steps, "
            "sft.save_every_steps)"
        ) from e
    return take_over(handoff, ctx.run_dir, ctx.experiment)


def scaling_config(ctx: RunContext) -> Any:
    """Ray Train's ScalingConfig for the run: its workers, each reserving `resources_per_worker` (a GPU among them
    makes the workers train on it)."""
    from ray.train import ScalingConfig

    resources = ctx.resources_per_worker or {"CPU": 1.0}
    return ScalingConfig(
        num_workers=ctx.num_processes, use_gpu=resources.get("GPU", 0) > 0, resources_per_worker=resources
    )


def train_worker(job: dict[str, Any]) -> None:
    """One Ray Train worker: start as every Ray worker does (tasks/core/ray_cluster.py: the stage's arguments rebuilt,
    the inputs this machine lacks fetched), train into the pipeline's output folder, and (worker 0) publish the
    checkpoint and hand it over to the pipeline."""
    os.environ[LAUNCH_ID_ENV] = job["launch_id"]  # the stage trains here, never launches again
    os.environ[MIRROR_ENV] = "1"  # checkpoints travel through MLflow
    stage, params, ctx = start_worker(job)
    policy = inspect.unwrap(stage)(**params, out=Path(job["out"]))  # the pipeline's folder, not one keyed here
    if is_main_process():
        hand_over(publish(policy, ctx.run_dir, ctx.experiment), job["handoff"], ctx.run_dir)
