"""Shared fixtures. Prefect and MLflow state always goes to temporary directories, never the project's."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_pipeline.tasks.core.runtime import setup

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Under pytest-xdist each worker runs torch's kernels on one thread, and so do the CLI runs it starts (they inherit
# the environment): the tiny test models gain nothing from a second thread, and two workers with two threads each on
# two cores lose time to each other. Set before any test module imports torch.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(threads, "1")

# The process defaults every way in applies, before anything imports prefect; Prefect's state goes to a temporary
# directory, never the project's .prefect (tests that run the CLI give each subprocess its own).
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="grpo-tests-prefect-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], True)
setup()

# The files that take longest, heaviest first, in seconds (setup, call and teardown summed per file from pytest's
# --durations, Dec 2026, on 2 cores; a file with tests in both `make test` and the `slow` tier has the larger of its two
# sums). Each tier runs them first, each file whole on one pytest-xdist worker (--dist loadfile
# --no-loadscope-reorder), so the two workers finish together instead of one starting the stack tests while the other
# has nothing left; the other files follow in their usual order. A stale number costs balance, never a result.
SLOWEST_FIRST = {
    "test_stack_integration.py": 380,  # the slow tier only
    "test_rehearse.py": 245,
    "test_resilience.py": 200,
    "test_pipeline_integration.py": 190,
    "test_resume.py": 130,
    "test_difficulty.py": 101,
    "test_bad_input.py": 92,
    "test_user_code.py": 73,
    "test_register.py": 73,
    "test_gate_evidence.py": 57,
    "test_stages.py": 55,
    "test_suites.py": 49,
    "test_keep_best.py": 38,
    "test_tiny_code.py": 34,
    "test_chat.py": 33,
    "test_serve_model.py": 32,
    "test_register_stores.py": 30,
    "test_distributed.py": 29,
    "test_health.py": 29,
    "test_algorithms.py": 25,
    "test_round_trips.py": 25,
    "test_sandbox.py": 21,
    "test_text_tools.py": 20,
    "test_reward_timeouts.py": 18,
    "test_golden_grpo.py": 17,
    "test_decisions_agree.py": 13,
    "test_code_python_semantics.py": 11,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -SLOWEST_FIRST.get(item.path.name, 0))  # stable: a file's own order is kept


@pytest.fixture(scope="session")
def code_sandbox() -> None:
    """Skip where the code sandbox refuses to run programs (root without bubblewrap or an unprivileged uid)."""
    from grpo_pipeline.rewards.sandbox import Sandbox, SandboxUnavailable

    try:
        Sandbox().close()
    except SandboxUnavailable as e:
        pytest.skip(f"the code sandbox cannot run programs here: {e}")


@dataclass(frozen=True)
class MicroRun:
    """A cold `grpo-pipeline run` of the micro config (tests/helpers.py) and what it left."""

    store: Path  # PREFECT_HOME in store/prefect-home, run dir and MLflow SQLite store in store/runs
    summary: dict  # its --summary-json
    grpo_checkpoint: Path  # round 1's policy, the version it registered (v1 of helpers.MICRO_MODEL)
    output: str  # everything it printed (stdout and stderr), at helpers.cli_env's console width


@pytest.fixture(scope="session")
def micro_run(tmp_path_factory: pytest.TempPathFactory) -> MicroRun:
    """One cold micro run per test session (per pytest-xdist worker), shared by the tests that inspect it instead of
    each paying for its own. Tests that run the pipeline again on its store (tests/test_pipeline_integration.py's
    reruns) change only what later runs add: more versions, flow runs and round-1 checkpoints, never this run's."""
    from tests.helpers import finished, run_pipeline

    store = tmp_path_factory.mktemp("micro-run")
    proc, summary_path = run_pipeline(store, "cold")
    summary = finished(proc, summary_path)
    (checkpoint,) = (store / "runs" / "grpo-round1").iterdir()
    return MicroRun(store, summary, checkpoint, proc.stdout + proc.stderr)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data directory {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prefect server on loopback per test session (per pytest-xdist worker), for the CLI runs that need a
    server but not one of their own: each would otherwise start a temporary one (seconds each). The runs whose tests
    read the server's own database (the session's cold `micro_run`) keep theirs."""
    from grpo_pipeline.stack import Service, free_port, wait_healthy
    from tests.helpers import cli_env

    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    log = open(home / "server.log", "w")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=cli_env(home, PREFECT_UI_ENABLED="false"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(
            Service(name="the tests' Prefect server", pid=proc.pid, log=str(home / "server.log")), f"{url}/health", 180
        )
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


@dataclass(frozen=True)
class Postgres:
    """A private PostgreSQL server on loopback (see the `postgres` fixture)."""

    url: str  # postgresql://grpo@127.0.0.1:<port>, without a database

    def new_database(self, name: str) -> str:
        """Create the empty database `name`; returns its URL."""
        import psycopg

        with psycopg.connect(f"{self.url}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"{self.url}/{name}"


def postgres_bindir() -> Path | None:
    """PostgreSQL's server programs (initdb, pg_ctl): pg_config's bindir, else Debian's versioned directory."""
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return candidates[-1].parent if candidates else None


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL server of the session's own (initdb in a temporary directory, trust authentication, loopback
    only), stopped at the end of the session even when tests failed. PostgreSQL refuses to run as root: as root it
    runs as the `postgres` user that Debian's package creates (.ci/run installs it). Skipped, with the reason, where
    the server programs are absent."""
    from grpo_pipeline.stack import free_port

    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed; apt-get install postgresql")
    base = Path(tempfile.mkdtemp(prefix="grpo-postgres-"))  # under /tmp: the postgres user can reach it
    as_owner: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data, log, port = base / "data", base / "server.log", free_port()

    def pg(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*as_owner, *args], capture_output=True, text=True, timeout=120)

    init = pg(str(bindir / "initdb"), "-D", str(data), "-U", "grpo", "--auth=trust", "-E", "UTF8", "--no-sync")
    assert init.returncode == 0, init.stdout + init.stderr
    options = f"-p {port} -h 127.0.0.1 -k {base} -c fsync=off"
    start = pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
    try:
        assert start.returncode == 0, start.stdout + start.stderr + (log.read_text() if log.exists() else "")
        yield Postgres(url=f"postgresql://grpo@127.0.0.1:{port}")
    finally:
        pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)
