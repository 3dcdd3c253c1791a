"""A stage as one Ray task on the cluster (`distributed.backend: ray`): how the evaluation suites fan out.

A stage decorated with `@on_cluster` runs, when its run context says `backend: ray`, as one Ray task that reserves
one worker's resources (`distributed.resources_per_worker`, one CPU by default) on whichever node has them free,
on the cluster at `distributed.ray_address` or on the local one the run started. The flow submits every suite's
evaluation of a model at once (flows/rounds.py, `evaluate_suites`), so a cluster scores them side by side.

As for a Ray Train job (tasks/core/ray_launch.py), the node needs no disk of the pipeline's: the stage's inputs (the
policy, the suite's rows) are published to the MLflow artifact store and fetched by a node that lacks them; the task
writes into the output folder the pipeline computed and hands its files back with its result through Ray's object
store (an evaluation's files are its per-item scores: kilobytes to a few megabytes), and the pipeline writes them
into the same folder here. Each task leaves `placement.json` there: the node that ran it and when.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.core.jobs import job_spec
from grpo_pipeline.tasks.core.ray_cluster import connect, shared_inputs, start_worker, where, worker_env
from grpo_pipeline.tasks.core.stage import RunContext, context_of

R = TypeVar("R")
IN_TASK_ENV = "GRPO_PIPELINE_IN_RAY_TASK"  # set inside the task: the stage runs there, never sends itself again
PLACEMENT_FILE = "placement.json"


def on_cluster(localize: Callable[[R, dict[str, Any]], R] = lambda result, params: result) -> Callable:
    """Run the stage as one Ray task when its `ctx` says `backend: ray` (see the module doc). `localize(result,
    params)` gives the result back its paths on this machine where it names the task's copies of the inputs."""

    def deco(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(fn)
        def run(**params: Any) -> R:
            ctx = context_of(params)
            if ctx.backend != "ray" or IN_TASK_ENV in os.environ:
                return fn(**params)
            return localize(ray_task(fn, params, ctx), params)

        return run

    return deco


def ray_task(fn: Callable[..., R], params: dict[str, Any], ctx: RunContext) -> R:
    """Run the stage `fn` as one Ray task and write the files it made into `params["out"]` here."""
    import ray

    out = Path(params["out"]).resolve()
    inputs = shared_inputs({k: v for k, v in params.items() if k != "out"}, ctx, out.parent.name)
    job = {**job_spec(fn, inputs), "out": str(out)}
    connect(ctx)
    resources = dict(ctx.resources_per_worker or {"CPU": 1.0})
    options = {
        "num_cpus": resources.pop("CPU", 0.0),
        "num_gpus": resources.pop("GPU", 0.0),
        "resources": resources,  # any custom resource a node was started with
        "max_retries": 0,  # a rerun of the stage (or Prefect's retry) runs it again
        "runtime_env": {"env_vars": {**worker_env(ctx), IN_TASK_ENV: "1"}},
    }
    logger.info("%s: running as a Ray task (%s) on %s", out.parent.name, _resources(options), where(ctx))
    result, files = ray.get(ray.remote(run_task).options(**options).remote(job))
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and target.read_bytes() == data):  # the task's node may share this disk
            _write(target, data)
    placement = json.loads(files[PLACEMENT_FILE])
    logger.info("%s: ran on node %s in %.1f s", out.parent.name, placement["node"][:12], placement["seconds"])
    return result


def run_task(job: dict[str, Any]) -> tuple[Any, dict[str, bytes]]:
    """Inside the Ray task: start as every Ray worker does (tasks/core/ray_cluster.py: the stage's arguments rebuilt,
    the inputs this node lacks fetched), run the stage into the pipeline's output folder, and return its result with
    the folder's files."""
    import ray

    started = time.time()
    stage, params, _ = start_worker(job)
    out = Path(job["out"])
    result = inspect.unwrap(stage)(**params, out=out)
    placement = {"node": ray.get_runtime_context().get_node_id(), "started": started, "finished": time.time()}
    placement["seconds"] = round(placement["finished"] - started, 3)
    _write(out / PLACEMENT_FILE, json.dumps(placement, indent=1).encode())
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return result, files


def _write(target: Path, data: bytes) -> None:
    """Write `target` whole or not at all (a reader never sees half of it)."""
    part = target.with_name(f".{target.name}.part")
    part.write_bytes(data)
    os.replace(part, target)


def _resources(options: dict[str, Any]) -> str:
    parts = [f"{options['num_cpus']:g} CPU", *([f"{options['num_gpus']:g} GPU"] if options["num_gpus"] else [])]
    return ", ".join(parts + [f"{v:g} {k}" for k, v in options["resources"].items()])
