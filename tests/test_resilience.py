"""Resilience: registration outlasts an MLflow outage, and two runs at once share a machine's state safely.

The outage test starts a real `mlflow server` on a loopback port (SQLite backend, artifacts in tmp_path), stops it
and starts it again on the same port and store while a pipeline waits to register. The concurrency test runs two
pipelines at once that share a run directory (datasets, base model, the MLflow SQLite store) and a PREFECT_HOME
(the temporary servers' database, the cached results), as two users on one machine would. Both run the CLI in fresh
processes on the micro config. The unit tests interrupt a registration in the middle, against a SQLite store.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import requests
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import TrackingUnavailable, require_reachable, unreachable
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.release.logged_model import COMPLETIONS_TABLE
from grpo_pipeline.tasks.release.versions import REGISTRATION_TAG
from tests.helpers import ROOT, cli_env, micro_overrides
from tests.test_register import eval_set, policy, scored

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on a fixed loopback port with its store in `root`: stopped and started again, it keeps its
    address and everything registered so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float = 180) -> None:
        cmd = [
            sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
            "--artifacts-destination", str(self.root / "artifacts"),
        ]  # fmt: skip
        with (self.root / "server.log").open("ab") as log:
            # its own process group: the server's uvicorn and job-runner children stop with it
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or still starting up
                pass
            assert self.proc.poll() is None, f"mlflow server exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"mlflow server did not answer within {timeout_s} s:\n{self.log()}"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        with pytest.raises(requests.ConnectionError):  # really down: nothing answers on its port
            requests.get(f"{self.url}/health", timeout=2)

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def mlflow_server(tmp_path: Path):
    server = MlflowServer(tmp_path / "mlflow-server")
    try:
        server.start()
        yield server
    finally:
        server.stop()


class Pipeline:
    """`grpo-pipeline run` on the micro config in a fresh process, its output (stdout and stderr) in a file."""

    def __init__(self, tmp: Path, env: dict[str, str], label: str, *overrides: str) -> None:
        self.log = tmp / f"{label}.log"
        self.summary = tmp / f"{label}.json"
        args = ["run", "--config", "configs/tiny-arith.yaml", "--summary-json", str(self.summary)]
        args += [*micro_overrides(tmp / "runs"), *overrides]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "grpo_pipeline.cli", *args], cwd=ROOT, env=env, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float) -> None:
        """Until `text` is in the output; fails if the run ends first or the time is up."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert self.proc.poll() is None, f"the run ended before {text!r}:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{self.output()[-4000:]}"
            time.sleep(0.5)

    def finish(self, timeout_s: float = 600) -> dict:
        """Wait for the run to end; its summary, after checking that it succeeded."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            self.kill()
        assert code == 0, f"pipeline failed ({code}):\n{self.output()[-6000:]}"
        return json.loads(self.summary.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def cached(summary: dict) -> dict[str, bool]:
    return {s["stage"]: s["cached"] for s in summary["stages"]}


def table_rows(client: MlflowClient, run_id: str, tmp: Path) -> int:
    path = client.download_artifacts(run_id, COMPLETIONS_TABLE, str(tmp))
    return len(json.loads(Path(path).read_text())["data"])


# ----------------------------------------------------------------------------- the pipeline


@pytest.mark.integration
@pytest.mark.slow
def test_registration_outlasts_an_mlflow_outage_without_training_again(tmp_path, mlflow_server):
    env = cli_env(tmp_path, MLFLOW_TRACKING_URI=mlflow_server.url)
    first = Pipeline(tmp_path, env, "first", "registry.model_name=outage-a")
    first.finish()
    client = MlflowClient(tracking_uri=mlflow_server.url)
    (trained,) = client.search_model_versions("name='outage-a'")

    mlflow_server.stop()
    # Registering under another name reruns only the register stage (its key covers the registry settings); it
    # starts while the server is down, and the server comes back once the stage has said it is retrying.
    second = Pipeline(tmp_path, env, "second", "registry.model_name=outage-b")
    try:
        second.wait_for("Retry 1/6", timeout_s=300)
        mlflow_server.start()
        summary = second.finish()
    finally:
        second.kill()
    output = second.output()
    assert f"MLflow at {mlflow_server.url} is unreachable" in output, output[-4000:]
    assert "Retry 1/6 will start 5 second(s) from now" in output, output[-4000:]

    # exit 0, the training came from the cache, the registration ran, waiting out at least the first retry delay
    stages = cached(summary)
    assert next(s["seconds"] for s in summary["stages"] if s["stage"] == "register-r1") >= 5
    assert stages.pop("register-r1") is False
    assert all(stages.values()), stages
    (registered,) = summary["registrations"]
    assert (registered["version"], registered["alias"], registered["existing"]) == ("1", "champion", False)
    # exactly one version, of the run the first pipeline trained; the first model untouched
    (version,) = client.search_model_versions("name='outage-b'")
    assert version.run_id == trained.run_id == registered["run_id"]
    assert len(client.search_model_versions("name='outage-a'")) == 1
    assert client.get_model_version("outage-b", "1").tags[REGISTRATION_TAG] == "finished"
    # the run holds one model (logged once, reused for the second name) and one completions table
    experiment = client.get_run(trained.run_id).info.experiment_id
    models = client.search_logged_models([experiment], filter_string=f"source_run_id = '{trained.run_id}'")
    assert len(models) == 1, [m.model_id for m in models]
    assert table_rows(client, trained.run_id, tmp_path) == 24 * 4  # micro eval: 24 items x 4 samples


@pytest.mark.integration
@pytest.mark.slow
def test_two_runs_at_once_share_a_run_dir_and_prefect_home(tmp_path):
    """Different recipe names, the same data and base model (same keys, built by both at once), the same MLflow
    SQLite store created by both at once, the same registered model gated by both at once."""
    env = cli_env(tmp_path)
    runs = [Pipeline(tmp_path, env, name, f"name={name}", "registry.model_name=shared") for name in ("left", "right")]
    try:
        summaries = [run.finish() for run in runs]
    finally:
        for run in runs:
            run.kill()
    for run in runs:
        # nothing failed and was saved by a retry (a store created twice at once, a directory replaced under a reader)
        assert "Task run failed" not in run.output(), run.output()[-6000:]

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    client = MlflowClient()
    found = client.search_model_versions("name='shared'")
    versions = {v.run_id: client.get_model_version("shared", v.version) for v in found}
    assert set(versions) == {s["registrations"][0]["run_id"] for s in summaries}  # each run its own version
    # gated one after the other: one first version (the champion), the other compared with it
    decisions = sorted(v.tags["gate.decision"] for v in versions.values())
    assert decisions[0] == "first" and decisions[1] in ("kept champion", "promoted"), decisions
    assert [a for v in versions.values() for a in v.aliases].count("champion") == 1
    names = {client.get_run(run_id).data.tags["mlflow.runName"] for run_id in versions}
    assert names == {"left-grpo-round1", "right-grpo-round1"}, names


# ----------------------------------------------------------------------------- the pieces


def test_an_unreachable_server_is_reported_at_once_and_retried():
    url = f"http://{HOST}:{free_port()}"  # nothing listens there
    with pytest.raises(TrackingUnavailable, match=f"MLflow at {url} is unreachable") as e:
        require_reachable(url)
    # at once: the one health probe's own refusal, not the error of MLflow's client after its retries
    assert isinstance(e.value.__cause__, requests.ConnectionError), e.value.__cause__
    assert unreachable(e.value)
    require_reachable("sqlite:///nowhere.db")  # a local store is not probed
    # MLflow's own error once its client has given up: a connection error under an MlflowException
    try:
        try:
            requests.get(url, timeout=2)
        except requests.ConnectionError as cause:
            raise MlflowException(f"API request to {url} failed with exception {cause}")  # noqa: B904 as MLflow does
    except MlflowException as wrapped:
        assert unreachable(wrapped)
    assert not unreachable(MlflowException("RESOURCE_DOES_NOT_EXIST: no such model"))
    assert not unreachable(ValueError("registry.gating_metric 'f1' is not an eval metric"))


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return tmp_path


def register_run(run_dir: Path, ckpt, result):
    cfg = RegistryConfig(experiment="test", model_name="m")
    ctx = RunContext(run_dir=str(run_dir), experiment="test", recipe="test", seed=0)
    return register_policy(ckpt, result, None, cfg, ctx, "name: test\n", {"round": "1"})


def gone(*args, **kwargs):
    raise MlflowException("API request failed with exception ConnectionError('connection refused')")


def test_a_version_left_without_its_alias_is_finished_by_the_retry(store, monkeypatch):
    """The server goes away after creating the version: neither its alias nor its deletion gets through. The retry
    sets the alias the version's gate tags record, and deletes the twin a retried create request may have made."""
    held_out = eval_set(store, 10)
    ckpt, result = policy(store, "a"), scored(store, held_out, [1] * 10, "a")
    with monkeypatch.context() as broken:
        broken.setattr(MlflowClient, "set_registered_model_alias", gone)
        broken.setattr(MlflowClient, "delete_model_version", gone)
        with pytest.raises(MlflowException, match="connection refused"):
            register_run(store, ckpt, result)
    client = MlflowClient()
    (left,) = client.search_model_versions("name='m'")
    left = client.get_model_version("m", left.version)
    assert (left.aliases, left.tags[REGISTRATION_TAG]) == ([], "pending")
    twin = client.create_model_version("m", left.source, run_id=ckpt.run_id, tags=left.tags, model_id=left.model_id)

    again = register_run(store, ckpt, result)
    assert (again.version, again.alias, again.existing) == (str(left.version), "champion", True)
    versions = client.search_model_versions("name='m'")
    assert [v.version for v in versions] == [left.version] and twin.version != left.version
    finished = client.get_model_version("m", left.version)
    assert (finished.aliases, finished.tags[REGISTRATION_TAG]) == (["champion"], "finished")


def test_a_model_logged_before_the_failure_is_reused(store, monkeypatch):
    """The server goes away after the model was logged, before the version was created: the retry creates one
    version from the model already logged, and neither the model nor the completions table is logged twice."""
    held_out = eval_set(store, 10)
    ckpt, result = policy(store, "a"), scored(store, held_out, [1] * 10, "a")
    with monkeypatch.context() as broken:
        broken.setattr(MlflowClient, "create_model_version", gone)
        with pytest.raises(MlflowException, match="connection refused"):
            register_run(store, ckpt, result)
    client = MlflowClient()
    assert client.search_model_versions("name='m'") == []
    experiment = client.get_run(ckpt.run_id).info.experiment_id
    (logged,) = client.search_logged_models([experiment], filter_string=f"source_run_id = '{ckpt.run_id}'")

    again = register_run(store, ckpt, result)
    assert (again.version, again.alias, again.existing) == ("1", "champion", False)
    (version,) = client.search_model_versions("name='m'")
    assert version.source == f"models:/{logged.model_id}"
    assert len(client.search_logged_models([experiment], filter_string=f"source_run_id = '{ckpt.run_id}'")) == 1
    assert table_rows(client, ckpt.run_id, store / "dl") == 10 * 2  # 10 items x 2 samples, once


def test_a_finished_version_whose_alias_moved_on_is_left_alone(store):
    """Registering a run again that is an old version (its champion alias taken since by a better one) returns it as
    it is: it is finished, not interrupted, so it does not take an alias back."""
    held_out = eval_set(store, 40)
    old_ckpt, old_result = policy(store, "a"), scored(store, held_out, [0] * 40, "a")
    old = register_run(store, old_ckpt, old_result)
    better = register_run(store, policy(store, "b", seed=1), scored(store, held_out, [1] * 40, "b"))
    assert (old.alias, better.alias, better.gate.decision) == ("champion", "champion", "promoted")

    again = register_run(store, old_ckpt, old_result)
    assert (again.version, again.existing) == (old.version, True)
    client = MlflowClient()
    assert client.get_model_version("m", old.version).aliases == []
    assert str(client.get_model_version_by_alias("m", "champion").version) == better.version
