"""Where the benchmarks' runs execute: a thread pool on this machine (`--jobs N`) or Ray tasks on a cluster
(`--ray ADDRESS`, or `--ray local` for a Ray instance started on this machine).

Either way each run is the same `grpo-pipeline run` subprocess with the same arguments and environment changes;
only the machine that starts it differs. A Ray task asks for one CPU (`num_cpus=1`), so a cluster runs as many
runs at a time as it has CPUs, each on whichever node has one free. The runs read and write their run directories
by path: on a cluster of several machines those must be on storage every node mounts at the same path (as the
repository and its virtual environment, whose interpreter the command names), which docs/scale.md sets up.

Ray is imported only when `--ray` is given, so the benchmarks run where it is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# The variables every parallel run gets, on either path: one thread per run, as on the 2-core machine the
# benchmarks' wall times were measured on (Ray would set OMP_NUM_THREADS from num_cpus, but not MKL's).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_command(cmd: list[str], cwd: str, env_changes: dict[str, str | None], in_ray: bool = False) -> dict:
    """Run `cmd` in `cwd` with this machine's environment changed by `env_changes` (None unsets a variable);
    return its wall time and the node that ran it. Raises CalledProcessError when the command fails."""
    env = dict(os.environ)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    node = "local"
    if in_ray:
        import ray

        node = ray.get_runtime_context().get_node_id()
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True)
    return {"seconds": time.perf_counter() - start, "node": node}


class Runner:
    """Runs commands locally (`ray_address` None) or as Ray tasks of one CPU each, and maps a function over items
    with enough threads to keep `jobs` local runs, or every item's Ray task, going at once."""

    def __init__(self, jobs: int = 1, ray_address: str | None = None) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be 1 or more, not {jobs}")
        self.jobs, self.ray_address = jobs, ray_address
        self._remote: Any = None

    @property
    def parallel(self) -> bool:
        """Whether runs share the machine (or the cluster) with other runs, so each gets one thread."""
        return self.jobs > 1 or self.ray_address is not None

    def __enter__(self) -> Runner:
        if self.ray_address is not None:
            self._remote = _connect(self.ray_address)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._remote is not None:
            import ray

            ray.shutdown()
            self._remote = None

    def launch(self, cmd: list[str], cwd: Path, env_changes: dict[str, str | None]) -> dict:
        """Run one command to completion here or on the cluster: {"seconds": wall time, "node": who ran it}."""
        if self._remote is None:
            if self.ray_address is not None:
                raise RuntimeError("Runner.launch with --ray outside `with Runner(...)`: the cluster is not connected")
            return run_command(cmd, str(cwd), env_changes)
        import ray

        return ray.get(self._remote.remote(cmd, str(cwd), env_changes, True))

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`fn` over `items` in threads, results in the items' order. With Ray every item gets a thread (each one
        only waits for its tasks) and the cluster's CPUs decide how many run at a time."""
        items = list(items)
        workers = max(len(items), 1) if self._remote is not None else self.jobs
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(fn, items))


def _connect(address: str) -> Any:
    """Connect to the Ray cluster at `address` ('local' starts one on this machine) and return `run_command` as a
    Ray task of one CPU."""
    try:
        import ray
        from ray import cloudpickle
    except ImportError as error:
        raise SystemExit(f'--ray needs Ray: pip install "ray[train]==2.60.0" ({error})') from error

    # The workers cannot import this file (benchmarks/ is not a package), so the task's code travels by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address=None if address == "local" else address)  # the runs' output streams here, as with --jobs
    nodes = [n for n in ray.nodes() if n["Alive"]]
    cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
    print(f"ray: {len(nodes)} node(s), {cpus:.0f} CPU(s) at {address}; one run per CPU", flush=True)
    return ray.remote(num_cpus=1)(run_command)
