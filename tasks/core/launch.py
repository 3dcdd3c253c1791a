"""Multi-process training: a training stage run again under `accelerate launch`, one process per device.

With `distributed.num_processes: N > 1`, a stage decorated with `@launched` does not train in the pipeline's own
process: it writes its arguments to a job file and runs `accelerate launch --num_processes N -m
grpo_pipeline.tasks.core.launch <job>` (torchrun on CPU). Each of the N processes imports the same stage, rebuilds its
arguments from their type hints and calls it; inside a launched process the stage trains (DDP, FSDP2 or DeepSpeed,
as the accelerate config says; gloo on CPU) and process 0 alone logs to MLflow and saves the result, which the
pipeline's process reads back. The stage's key and output directory are the same either way (the process count is
not part of the key).

With `distributed.backend: ray` the same job (module, stage, arguments) runs as a Ray Train job instead, on workers
that may sit on other machines (tasks/core/ray_launch.py).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import ConfigError
from grpo_pipeline.tasks.core.common import Checkpoint, logger
from grpo_pipeline.tasks.core.jobs import LAUNCH_ID_ENV, in_launched_process, is_main_process, job_spec, rebuild_job
from grpo_pipeline.tasks.core.ray_launch import ray_launch
from grpo_pipeline.tasks.core.runtime import setup
from grpo_pipeline.tasks.core.stage import RunContext, context_of

RESULT_ENV = "GRPO_PIPELINE_LAUNCH_RESULT"  # where process 0 of a launch writes the stage's Checkpoint


def launched(fn: Callable[..., Checkpoint]) -> Callable[..., Checkpoint]:
    """Train `fn` under `accelerate launch` when its `ctx` asks for more than one process (see the module doc)."""

    @functools.wraps(fn)
    def run(**params: Any) -> Checkpoint:
        ctx = context_of(params)
        if in_launched_process() or (ctx.backend == "accelerate" and ctx.num_processes <= 1):
            return fn(**params)
        if ctx.backend == "ray":  # a Ray Train job, on as many machines as Ray places its workers on
            return ray_launch(fn, params, ctx)
        return launch(fn, {k: v for k, v in params.items() if k != "out"}, ctx)

    return run


def launch_command(ctx: RunContext, job: Path) -> tuple[list[str], dict[str, str]]:
    """The command that starts `ctx.num_processes` processes on this machine, and the environment they need.

    With an accelerate config (FSDP2, DeepSpeed) or on GPUs: `accelerate launch`. On CPU: torchrun (accelerate's own
    CPU launcher needs MPI for more than one process), with ACCELERATE_USE_CPU so that accelerate sets up DDP over
    gloo in each process."""
    import torch

    n = str(ctx.num_processes)
    target = ["-m", "grpo_pipeline.tasks.core.launch", str(job)]
    if ctx.accelerate_config:
        if not Path(ctx.accelerate_config).is_file():
            raise ConfigError(
                f"distributed.accelerate_config: {ctx.accelerate_config} does not exist (relative paths are from the "
                "working directory); use one of configs/accelerate/ (ddp, fsdp2, zero2, zero3) or unset it"
            )
        return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", n,
                "--config_file", ctx.accelerate_config, *target], {}  # fmt: skip
    if torch.cuda.is_available():
        return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", n, "--num_machines", "1",
                "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no", *target], {}  # fmt: skip
    port = str(free_port())
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", n, "--master_port", port, *target], {
        "ACCELERATE_USE_CPU": "true",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[..., Checkpoint], params: dict[str, Any], ctx: RunContext) -> Checkpoint:
    """Run the stage `fn` in `ctx.num_processes` processes and return what its process 0 saved."""
    with tempfile.TemporaryDirectory(prefix="grpo-launch-") as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps(job_spec(fn, params)))
        # The launched processes import what this one can (the user's reward modules beside the recipe included).
        cmd, extra_env = launch_command(ctx, job)
        env = {
            **os.environ,
            **extra_env,
            RESULT_ENV: str(result),
            LAUNCH_ID_ENV: uuid.uuid4().hex[:8],
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        logger.info("%s: training in %d processes: %s", fn.__name__, ctx.num_processes, " ".join(cmd))
        done = subprocess.run(cmd, env=env)
        if done.returncode != 0 or not result.is_file():
            raise RuntimeError(
                f"{fn.__name__} in {ctx.num_processes} processes ({cmd[2]}) exited with code "
                f"{done.returncode}; its processes' errors are in the log above"
            )
        return Checkpoint.model_validate_json(result.read_text())


def run_job(job_path: Path) -> None:
    """One launched process: rebuild the stage's arguments from their type hints and call the stage."""
    stage, params = rebuild_job(json.loads(job_path.read_text()))
    checkpoint = stage(**params)
    if is_main_process():
        Path(os.environ[RESULT_ENV]).write_text(checkpoint.model_dump_json())


if __name__ == "__main__":
    setup()
    run_job(Path(sys.argv[1]))
