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
import math
import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import ConfigError
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, logger
from grpo_pipeline.tasks.core.launch import LAUNCH_ID_ENV, is_main_process, job_spec, rebuild_job
from grpo_pipeline.tasks.core.publish import (
    hand_over,
    materialize,
    publish,
    refs_in,
    replace_refs,
    share_refs,
    take_over,
)
from grpo_pipeline.tasks.core.stage import RunContext, context_of
from grpo_pipeline.tasks.core.tracking import configure_mlflow, tracking_uri
from grpo_pipeline.tasks.training.checkpoint_mirror import MIRROR_ENV

# What the workers need from the pipeline's environment when they run elsewhere: where MLflow is and how to reach it,
# the project's own settings, the hub's cache and credentials.
FORWARDED_PREFIXES = ("MLFLOW_", "GRPO_PIPELINE_", "HF_", "OMP_NUM_THREADS")
_connecting = threading.Lock()
_published: dict[tuple[str, str, str], Ref] = {}  # (MLflow store, path, fingerprint) -> the Ref with its uri
_publishing = threading.Lock()


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


def shared_inputs(params: dict[str, Any], ctx: RunContext, label: str) -> dict[str, Any]:
    """The stage's arguments with every input given a `uri` in MLflow, each published once per process and store
    (a model's evaluation suites, sent at once, share its policy), and the run directory absolute, so that a worker
    on any machine finds them."""
    store = tracking_uri(ctx.run_dir)
    with _publishing:
        pending = [r for r in refs_in(params) if (store, r.path, r.fingerprint) not in _published]
        for ref, shared in zip(pending, share_refs(pending, ctx, label), strict=True):
            _published[(store, ref.path, ref.fingerprint)] = shared
    shared = replace_refs(params, lambda ref: _published[(store, ref.path, ref.fingerprint)])
    absolute = ctx.model_copy(update={"run_dir": str(Path(ctx.run_dir).resolve())})
    if "ctx" in shared:
        return {**shared, "ctx": absolute}
    return {**shared, "spec": shared["spec"].model_copy(update={"ctx": absolute})}


def scaling_config(ctx: RunContext) -> Any:
    """Ray Train's ScalingConfig for the run: its workers, each reserving `resources_per_worker` (a GPU among them
    makes the workers train on it)."""
    from ray.train import ScalingConfig

    resources = ctx.resources_per_worker or {"CPU": 1.0}
    return ScalingConfig(
        num_workers=ctx.num_processes, use_gpu=resources.get("GPU", 0) > 0, resources_per_worker=resources
    )


def worker_env(ctx: RunContext) -> dict[str, str]:
    """The environment each worker gets: MLflow's address as this process sees it (a SQLite store under the run
    directory, made absolute, or the tracking server), the import path, the settings in FORWARDED_PREFIXES, and on CPU
    the flag that makes accelerate train data parallel over gloo."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    env["MLFLOW_TRACKING_URI"] = tracking_uri(ctx.run_dir)
    # the user's reward modules beside the recipe import as they do here (on machines that have them at that path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if not (ctx.resources_per_worker or {}).get("GPU"):
        # as for torchrun on CPU (launch.py): accelerate sets up DDP over gloo only when told the run is on CPU
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def where(ctx: RunContext) -> str:
    return f"cluster at {ctx.ray_address}" if ctx.ray_address else "a local Ray cluster"


def connect(ctx: RunContext) -> None:
    """Connect to the cluster at `ctx.ray_address`, or start a local one with room for every worker; once per
    process (a connection already made is kept, the run's later stages reuse it)."""
    import ray

    with _connecting:  # the suites' evaluations are sent from several threads at once
        if not ray.is_initialized():
            _init(ctx)


def _init(ctx: RunContext) -> None:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine unless asked for
    if ctx.ray_address:
        uri = tracking_uri(ctx.run_dir)
        if not uri.startswith(("http://", "https://")):
            logger.warning(
                "distributed.ray_address: workers log to MLflow at %s, a store on this machine's disk; workers on "
                "other machines need a tracking server: start one (grpo-pipeline serve) and set MLFLOW_TRACKING_URI",
                uri,
            )
        ray.init(address=ctx.ray_address)
        return
    cpus = ctx.num_processes * (ctx.resources_per_worker or {"CPU": 1.0}).get("CPU", 0)
    ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(cpus)), include_dashboard=False)


def train_worker(job: dict[str, Any]) -> None:
    """One Ray Train worker: rebuild the stage's arguments, fetch the inputs this machine lacks, train into the
    pipeline's output folder, and (worker 0) publish the checkpoint and hand it over to the pipeline."""
    from grpo_pipeline.tasks.core.runtime import add_import_paths, setup

    setup()
    os.environ[LAUNCH_ID_ENV] = job["launch_id"]  # the stage trains here, never launches again
    os.environ[MIRROR_ENV] = "1"  # checkpoints travel through MLflow
    stage, params = rebuild_job(job)
    ctx = context_of(params)
    add_import_paths(getattr(params.get("spec"), "code_dir", None))  # the recipe's own modules, as the pool does
    params = replace_refs(params, lambda ref: materialize(ref, ctx.run_dir))  # fetched where not on this machine
    policy = inspect.unwrap(stage)(**params, out=Path(job["out"]))  # the pipeline's folder, not one keyed here
    if is_main_process():
        hand_over(publish(policy, ctx.run_dir, ctx.experiment), job["handoff"], ctx.run_dir)
