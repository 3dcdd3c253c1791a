"""The local production stack, on loopback: a Prefect server, an MLflow tracking server, the work pools `cpu` and
`gpu`, the deployments of deployments/prefect.yaml, and one worker per pool.

`serve` starts every part in the background (each in its own process group, logging to `<state_dir>/logs/`) and
returns once all of it is healthy; what it started (ports, pids, URLs) goes to `<state_dir>/stack.json`, so `stop`
stops exactly that and `status` reports it. The two servers keep their records in SQLite under `<state_dir>` by
default, or in PostgreSQL, one setting each (`serve --prefect-db/--mlflow-db`, or the environment):
PREFECT_SERVER_DATABASE_CONNECTION_URL (Prefect's own setting) and GRPO_PIPELINE_MLFLOW_DB, each a
`postgresql://user:password@host:port/database` URL (the driver is added: asyncpg for Prefect, psycopg for MLflow).
MLflow's artifacts stay in `<state_dir>/mlartifacts`, served over HTTP (`--serve-artifacts`), so workers on other
machines need no shared disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
from pydantic import BaseModel

from grpo_pipeline.tasks.core.runtime import DEFAULTS

STATE_FILE = "stack.json"
DEFAULT_STATE_DIR = ".grpo-stack"
POOLS = ("cpu", "gpu")
PREFECT_FILE = "deployments/prefect.yaml"
HOST = "127.0.0.1"
PREFECT_DB_ENV = "PREFECT_SERVER_DATABASE_CONNECTION_URL"
MLFLOW_DB_ENV = "GRPO_PIPELINE_MLFLOW_DB"
DRIVERS = {"prefect": "postgresql+asyncpg", "mlflow": "postgresql+psycopg"}


class StackError(RuntimeError):
    """The stack cannot be started or reached; the message says what and how to fix it."""


class Service(BaseModel):
    name: str
    pid: int
    log: str


class Stack(BaseModel):
    """What `serve` started, as saved in `<state_dir>/stack.json`."""

    state_dir: str
    project_dir: str
    prefect_api_url: str
    mlflow_url: str
    services: list[Service]
    # Where each server keeps its records: "sqlite", or the PostgreSQL URL without its password.
    databases: dict[str, str] = {}

    @property
    def prefect_ui_url(self) -> str:
        return self.prefect_api_url.removesuffix("/api")

    def client_env(self) -> dict[str, str]:
        """What a process needs to run flows against this stack (the CLI, a worker, a test)."""
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            # one store of cached task results for CLI runs and worker runs alike
            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(Path(self.state_dir) / "results"),
        }

    def alive(self) -> dict[str, bool]:
        return {s.name: pid_alive(s.pid) for s in self.services}


def default_state_dir() -> Path:
    return Path(os.environ.get("GRPO_PIPELINE_STACK_DIR", DEFAULT_STATE_DIR)).resolve()


def load(state_dir: Path | None = None) -> Stack | None:
    """The stack recorded in `state_dir`, or None when none was started there."""
    path = (state_dir or default_state_dir()) / STATE_FILE
    return Stack.model_validate_json(path.read_text()) if path.is_file() else None


def running(state_dir: Path | None = None) -> Stack | None:
    """The recorded stack if its servers are up (answering their health checks), else None."""
    stack = load(state_dir)
    if stack is None or not all(stack.alive().values()):
        return None
    up = healthy(f"{stack.prefect_api_url}/health") and healthy(f"{stack.mlflow_url}/health")
    return stack if up else None


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- serve


def database_url(url: str | None, server: str) -> str | None:
    """`url` (a PostgreSQL URL, with or without a driver) as `server` ('prefect' or 'mlflow') opens it; None: SQLite.
    Anything but PostgreSQL is refused with the fix."""
    if not url:
        return None
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        setting = PREFECT_DB_ENV if server == "prefect" else MLFLOW_DB_ENV
        raise StackError(
            f"the {server} database URL {redacted(url)!r} ({setting}) is not a PostgreSQL URL; give "
            "postgresql://user:password@host:port/database, or leave it unset for SQLite under the state directory"
        )
    return f"{DRIVERS[server]}://{rest}"


def redacted(url: str) -> str:
    """`url` without its password (for stack.json, status and errors)."""
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{location}"


def serve(
    state_dir: Path | None = None,
    project_dir: Path | None = None,
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    timeout_s: float = 180.0,
    prefect_db: str | None = None,
    mlflow_db: str | None = None,
) -> Stack:
    """Start the whole stack and return once it is healthy; on any failure, stop what was started and raise.
    `prefect_db` / `mlflow_db`: PostgreSQL URLs for the servers' records (default: the environment's
    PREFECT_SERVER_DATABASE_CONNECTION_URL / GRPO_PIPELINE_MLFLOW_DB, else SQLite under `state_dir`)."""
    state_dir = (state_dir or default_state_dir()).resolve()
    project_dir = (project_dir or Path.cwd()).resolve()
    if not (project_dir / PREFECT_FILE).is_file():
        raise StackError(f"{project_dir / PREFECT_FILE} not found; run serve from the project's directory")
    existing = load(state_dir)
    if existing is not None and any(existing.alive().values()):
        raise StackError(
            f"the stack in {state_dir} is already up (Prefect UI {existing.prefect_ui_url}, MLflow UI "
            f"{existing.mlflow_url}); `grpo-pipeline status` shows it, `grpo-pipeline stop` stops it"
        )
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    prefect_port = prefect_port or free_port()
    mlflow_port = mlflow_port or free_port()
    prefect_db = database_url(prefect_db or os.environ.get(PREFECT_DB_ENV), "prefect")
    mlflow_db = database_url(mlflow_db or os.environ.get(MLFLOW_DB_ENV), "mlflow")
    stack = Stack(
        state_dir=str(state_dir),
        project_dir=str(project_dir),
        prefect_api_url=f"http://{HOST}:{prefect_port}/api",
        mlflow_url=f"http://{HOST}:{mlflow_port}",
        services=[],
        databases={"prefect": redacted(prefect_db) if prefect_db else "sqlite",
                   "mlflow": redacted(mlflow_db) if mlflow_db else "sqlite"},
    )  # fmt: skip
    env = stack_env(stack)
    for key in (PREFECT_DB_ENV, MLFLOW_DB_ENV):  # only a server gets a database URL, and only the one chosen here
        env.pop(key, None)
    databases = {"prefect": prefect_db, "mlflow": mlflow_db or f"sqlite:///{state_dir / 'mlflow.db'}"}
    try:
        _start_servers(stack, env, prefect_port, mlflow_port, timeout_s, databases)
        for pool in POOLS:
            _cli(["prefect", "work-pool", "create", pool, "--type", "process", "--overwrite"], env, project_dir)
        _cli(["prefect", "--no-prompt", "deploy", "--prefect-file", PREFECT_FILE, "--all"], env, project_dir)
        for pool in POOLS:
            cmd = ["prefect", "worker", "start", "--pool", pool, "--name", f"grpo-{pool}"]
            stack.services.append(_spawn(f"worker-{pool}", cmd, env, stack))
        _wait_for_workers(stack, timeout_s)
    except BaseException:
        stop_services(stack)
        raise
    (state_dir / STATE_FILE).write_text(stack.model_dump_json(indent=2))
    return stack


def stack_env(stack: Stack) -> dict[str, str]:
    """The environment of every process of the stack: its own Prefect home, loopback URLs, analytics off."""
    state = Path(stack.state_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "MLFLOW_TRACKING_"))}
    env.update(stack.client_env())
    env.update(
        PREFECT_HOME=str(state / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_API_HOST=HOST,
        PYTHONUNBUFFERED="1",
    )
    for key, value in {**DEFAULTS, "PREFECT_WORKER_QUERY_SECONDS": "5"}.items():
        env.setdefault(key, value)
    return env


def _start_servers(
    stack: Stack, env: Mapping[str, str], prefect_port: int, mlflow_port: int, timeout_s: float,
    databases: Mapping[str, str | None],
) -> None:  # fmt: skip
    """The two servers, each given its database in its own environment (never on a command line `ps` shows)."""
    state = Path(stack.state_dir)
    prefect = ["prefect", "server", "start", "--host", HOST, "--port", str(prefect_port)]
    prefect_env = {**env, **({PREFECT_DB_ENV: databases["prefect"]} if databases["prefect"] else {})}
    stack.services.append(_spawn("prefect-server", prefect, prefect_env, stack))
    mlflow = [
        "mlflow", "server", "--host", HOST, "--port", str(mlflow_port), "--workers", "1",
        "--artifacts-destination", str(state / "mlartifacts"), "--serve-artifacts",
    ]  # fmt: skip
    mlflow_env = {**env, "MLFLOW_BACKEND_STORE_URI": databases["mlflow"]}
    stack.services.append(_spawn("mlflow-server", mlflow, mlflow_env, stack))
    wait_healthy(stack.services[0], f"{stack.prefect_api_url}/health", timeout_s)
    wait_healthy(stack.services[1], f"{stack.mlflow_url}/health", timeout_s)


def _bin(name: str) -> str:
    """A console script of this environment (prefect, mlflow), found beside the interpreter."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise StackError(f"{path} not found; is the project installed in this environment (make install)?")
    return str(path)


def _spawn(name: str, cmd: list[str], env: Mapping[str, str], stack: Stack) -> Service:
    log = Path(stack.state_dir) / "logs" / f"{name}.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [_bin(cmd[0]), *cmd[1:]],
            cwd=stack.project_dir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole, outlives this command
        )
    return Service(name=name, pid=proc.pid, log=str(log))


def _cli(cmd: list[str], env: Mapping[str, str], cwd: Path) -> None:
    proc = subprocess.run([_bin(cmd[0]), *cmd[1:]], cwd=cwd, env=dict(env), capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(f"`{' '.join(cmd)}` failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def healthy(url: str) -> bool:
    """Whether `url` (a server's health endpoint) answers 200."""
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(service: Service, url: str, timeout_s: float) -> None:
    """Until `url` answers; StackError (with the service's log tail) when its process exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if not pid_alive(service.pid):
            raise StackError(f"{service.name} exited during start-up; its log ({service.log}) ends:\n{_tail(service)}")
        if time.monotonic() > deadline:
            raise StackError(f"{service.name} did not answer {url} within {timeout_s:.0f} s; see {service.log}")
        time.sleep(0.5)


def _wait_for_workers(stack: Stack, timeout_s: float) -> None:
    """Until each pool has an ONLINE worker (a worker registers with its first poll)."""
    deadline = time.monotonic() + timeout_s
    for pool in POOLS:
        url = f"{stack.prefect_api_url}/work_pools/{pool}/workers/filter"
        while True:
            workers = httpx.post(url, json={}, timeout=5.0).json()
            if any(w.get("status") == "ONLINE" for w in workers):
                break
            worker = next(s for s in stack.services if s.name == f"worker-{pool}")
            if not pid_alive(worker.pid):
                raise StackError(f"the {pool} worker exited; its log ({worker.log}) ends:\n{_tail(worker)}")
            if time.monotonic() > deadline:
                raise StackError(f"no {pool} worker came online within {timeout_s:.0f} s; see {worker.log}")
            time.sleep(0.5)


def _tail(service: Service, chars: int = 2000) -> str:
    try:
        return Path(service.log).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ----------------------------------------------------------------------------- stop


def stop(state_dir: Path | None = None) -> list[str]:
    """Stop what `serve` recorded in `state_dir`; returns the names of the services that were still running."""
    state_dir = (state_dir or default_state_dir()).resolve()
    stack = load(state_dir)
    if stack is None:
        return []
    stopped = stop_services(stack)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped


def stop_services(stack: Stack, grace_s: float = 15.0) -> list[str]:
    """SIGTERM each service's process group (workers first, servers last), then SIGKILL what is left."""
    live = [s for s in reversed(stack.services) if pid_alive(s.pid)]
    for service in live:
        _signal_group(service.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while pid_alive(service.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_group(service.pid, signal.SIGKILL)
    return [s.name for s in live]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pid, sig)


def status_lines(stack: Stack | None) -> list[str]:
    """Human-readable status of a recorded stack."""
    if stack is None:
        return ["no stack recorded; start one with `grpo-pipeline serve`"]
    alive = stack.alive()
    lines = [f"Prefect UI {stack.prefect_ui_url}", f"MLflow UI  {stack.mlflow_url}"]
    if stack.databases:
        lines.append("databases: " + ", ".join(f"{server} {db}" for server, db in stack.databases.items()))
    lines += [f"{s.name:15} pid {s.pid:<8} {'running' if alive[s.name] else 'STOPPED'}" for s in stack.services]
    return lines


def summary_json(stack: Stack) -> str:
    return json.dumps({**stack.model_dump(), "alive": stack.alive()}, indent=2)
