"""Helpers for tests that run the pipeline through its CLI."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_pipeline.stack import Stack

ROOT = Path(__file__).resolve().parents[1]
MICRO_MODEL = "micro-arith"  # the registered model of `run_pipeline`'s runs


def micro_overrides(run_dir: Path) -> list[str]:
    """A few seconds of every stage: enough to exercise the whole flow, not to learn anything."""
    return [
        f"run_dir={run_dir}",
        "data.num_train=200",
        "data.num_eval=24",
        "data.num_probe=8",
        "sft.max_steps=6",
        "sft.batch_size=16",
        "grpo.rounds=1",
        "grpo.steps_per_round=2",
        "grpo.prompts_per_step=2",
        "grpo.generations_per_prompt=4",
        "grpo.log_every_steps=1",
        # a 2-step round on 8 probe rows would mostly return its start, and such a round registers nothing
        "grpo.keep=last",
        "grpo.keep_over_start=false",
        "grpo.keep_margin=0",
        # a micro policy solves nothing, so a filter would keep no prompt for a second round
        "grpo.difficulty_filter.enabled=false",
        "eval.n_samples=4",
        "eval.k=[1,2,4]",
        "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1",
        "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64",
    ]


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        PREFECT_HOME=str(tmp / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
        **extra,
    )
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `grpo-pipeline` as users do, in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "grpo_pipeline.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_pipeline(
    store: Path, name: str, *extra: str, api: str | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """`grpo-pipeline run` of the micro config on `store` (its PREFECT_HOME, run dir and MLflow SQLite store);
    returns the process and where its summary is written (`<store>/<name>.json`). Later `extra` values win. With
    `api` (a running Prefect server's API URL, conftest's `prefect_api`) the run uses that server instead of starting
    a temporary one."""
    summary = store / f"{name}.json"
    args = [
        "run",
        "--config",
        "configs/tiny-arith.yaml",
        "--summary-json",
        str(summary),
        *micro_overrides(store / "runs"),
        f"registry.model_name={MICRO_MODEL}",
        *extra,
    ]
    return run_cli(args, cli_env(store, **({"PREFECT_API_URL": api} if api else {}))), summary


def finished(proc: subprocess.CompletedProcess, summary: Path) -> dict:
    """The summary of a pipeline run that must have succeeded."""
    assert proc.returncode == 0, f"pipeline failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(summary.read_text())


@contextlib.contextmanager
def serve_stack(tmp: Path, *serve_args: str) -> Iterator[Stack]:
    """`grpo-pipeline serve` on free loopback ports with its state in `tmp` (more options in `serve_args`), workers
    polling every second (the stack's default is 5 s, so a deployment run or its GRPO child waits less); stopped with
    `grpo-pipeline stop` on the way out, checking that no process it started is left, also when a test failed."""
    from grpo_pipeline.stack import Stack, pid_alive

    state = tmp / "state"
    env = cli_env(tmp, PREFECT_WORKER_QUERY_SECONDS="1")
    bin_dir = Path(sys.executable).parent
    serve = [str(bin_dir / "grpo-pipeline"), "serve", "--state-dir", str(state), "--prefect-port", "0",
             "--mlflow-port", "0", *serve_args]  # fmt: skip
    started: Stack | None = None
    try:
        proc = subprocess.run(serve, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        if (state / "stack.json").exists():
            started = Stack.model_validate_json((state / "stack.json").read_text())
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert started is not None
        yield started
    finally:
        subprocess.run([str(bin_dir / "grpo-pipeline"), "stop", "--state-dir", str(state)], cwd=ROOT, env=env,
                       timeout=120)  # fmt: skip
        if started is not None:
            deadline = time.monotonic() + 30
            while any(pid_alive(s.pid) for s in started.services) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not [s.name for s in started.services if pid_alive(s.pid)], "grpo-pipeline stop left processes"
