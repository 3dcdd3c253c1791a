"""What the Ray backend's two ways of running a stage share (`distributed.backend: ray`): the connection to the
cluster, the stage's inputs published for workers that share no disk with the pipeline, the workers' environment,
and the start-up every worker runs before it calls the stage.

A training stage runs as a Ray Train job (tasks/core/ray_launch.py), an evaluation as one Ray task
(tasks/core/ray_tasks.py). Either way the pipeline sends the stage's job (tasks/core/jobs.py) with every input given
a copy in MLflow's artifact store (`shared_inputs`), and each worker starts with `start_worker`: the process
defaults, the stage and its arguments rebuilt, the recipe's own modules importable, and the inputs this machine
lacks fetched.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_pipeline.tasks.core.common import Ref, logger
from grpo_pipeline.tasks.core.jobs import rebuild_job
from grpo_pipeline.tasks.core.publish import materialize, refs_in, replace_refs, share_refs
from grpo_pipeline.tasks.core.runtime import add_import_paths, setup
from grpo_pipeline.tasks.core.stage import RunContext, context_of
from grpo_pipeline.tasks.core.tracking import tracking_uri

# What the workers need from the pipeline's environment when they run elsewhere: where MLflow is and how to reach it,
# the project's own settings, the hub's cache and credentials.
FORWARDED_PREFIXES = ("MLFLOW_", "GRPO_PIPELINE_", "HF_", "OMP_NUM_THREADS")
_connecting = threading.Lock()
_published: dict[tuple[str, str, str], Ref] = {}  # (MLflow store, path, fingerprint) -> the Ref with its uri
_publishing = threading.Lock()


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


def start_worker(job: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any], RunContext]:
    """What a worker (of a Ray Train job or a Ray task) does before it calls the stage: apply the process defaults,
    rebuild the stage and its arguments, put the recipe's own modules on the import path (as a work pool does), and
    fetch the inputs this machine lacks. Returns the stage, its arguments (inputs at their paths here) and its run
    context."""
    setup()
    stage, params = rebuild_job(job)
    ctx = context_of(params)
    add_import_paths(getattr(params.get("spec"), "code_dir", None))
    params = replace_refs(params, lambda ref: materialize(ref, ctx.run_dir))  # fetched where not on this machine
    return stage, params, ctx
