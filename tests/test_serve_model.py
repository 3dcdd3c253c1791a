"""`grpo-pipeline serve-model`, the model card's serve command, works as written: from a shell whose PATH lacks the
virtual environment (where `mlflow models serve --env-manager local` exits 127, finding no `uvicorn`), it serves a
registered version on loopback and answers /invocations."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from grpo_pipeline.serve_model import serve_command
from grpo_pipeline.stack import free_port
from grpo_pipeline.tasks.release.card import serve_line
from tests.helpers import ROOT, cli_env

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("grpo-pipeline"))
BARE_PATH = os.pathsep.join(["/usr/local/bin", "/usr/bin", "/bin"])  # no venv on it
# A model from code: MLflow loads this file in the server; it answers each prompt with the sum it asks for.
MODEL_CODE = """\
import mlflow


class Adder(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        prompts = model_input.iloc[:, 0] if hasattr(model_input, "iloc") else model_input
        return [str(sum(int(x) for x in p.rstrip("=").split("+"))) for p in prompts]


mlflow.models.set_model(Adder())
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Path:
    """A run directory whose SQLite store holds `adder` version 1 under the alias `champion`."""
    run_dir = tmp_path_factory.mktemp("serve") / "runs"
    run_dir.mkdir()
    code = run_dir.parent / "adder.py"
    code.write_text(MODEL_CODE)
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        mlflow.set_experiment("serve-model")
        with mlflow.start_run():
            mlflow.pyfunc.log_model(name="model", python_model=str(code), registered_model_name="adder")
        MlflowClient(uri, uri).set_registered_model_alias("adder", "champion", "1")
    finally:
        mlflow.set_tracking_uri(previous)
    return run_dir


def bare_env(tmp: Path) -> dict[str, str]:
    """A user's shell that did not activate the venv: PATH without it, no VIRTUAL_ENV."""
    env = cli_env(tmp, PATH=BARE_PATH)
    env.pop("VIRTUAL_ENV", None)
    return env


@contextlib.contextmanager
def serving(args: list[str], tmp_path: Path) -> Iterator[subprocess.Popen]:
    """`args` started from the repo root with the venv off PATH, stopped whatever happens (with the uvicorn it
    started: the whole process group)."""
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(args, cwd=ROOT, env=bare_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


@pytest.fixture
def server(registry: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """`grpo-pipeline serve-model models:/adder@champion` on a free loopback port."""
    port = free_port()
    args = [CLI, "serve-model", "models:/adder@champion", "--run-dir", str(registry), "--port", str(port)]
    with serving(args, tmp_path) as proc:
        yield proc, port


def post(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def wait_until_up(proc: subprocess.Popen, port: int, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the server did not answer /ping within {timeout_s} s:\n{log.read_text()[-3000:]}")


def test_serve_model_answers_invocations_without_the_venv_on_path(server, tmp_path):
    proc, port = server
    wait_until_up(proc, port, tmp_path / "serve.log")
    assert post(port, {"inputs": ["47+38=", "2+2="]}) == {"predictions": ["85", "4"]}


def test_the_model_cards_serve_line_works_as_written(registry, tmp_path):
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{registry / 'mlflow.db'}")  # as in the register stage
    try:
        line = serve_line("adder")
    finally:
        mlflow.set_tracking_uri(previous)
    args = shlex.split(line)
    assert args[0] == CLI and args[-2:] == ["--port", "5001"]
    port = free_port()  # the card's port may be taken here; everything else runs as the card writes it
    with serving([*args[:-1], str(port)], tmp_path) as proc:
        wait_until_up(proc, port, tmp_path / "serve.log")
        assert post(port, {"inputs": ["1+2="]}) == {"predictions": ["3"]}


def test_a_model_the_registry_does_not_hold_is_one_error(registry, tmp_path):
    args = [CLI, "serve-model", "models:/adder@nope", "--run-dir", str(registry), "--port", str(free_port())]
    proc = subprocess.run(args, cwd=ROOT, env=bare_env(tmp_path), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert out.count("error:") == 1 and "models:/adder@nope" in out and "--run-dir" in out, out
    assert "Traceback" not in out, out


def test_no_store_under_the_run_dir_is_one_error_and_creates_none(tmp_path):
    args = [CLI, "serve-model", "models:/adder@champion", "--run-dir", str(tmp_path / "runs")]
    proc = subprocess.run(args, cwd=ROOT, env=bare_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no MLflow store" in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_the_serve_command_puts_this_interpreters_bin_first():
    argv, env = serve_command("models:/m@champion", "sqlite:////x/mlflow.db", "127.0.0.1", 5001)
    assert argv[:3] == [sys.executable, "-m", "mlflow"] and argv[3:5] == ["models", "serve"]
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:////x/mlflow.db"
