"""Champion/challenger gating and all-or-nothing registration, against a SQLite store and a real MLflow server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.common import Checkpoint
from grpo_pipeline.tasks.evaluate import EvalResult
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.stage import RunContext
from grpo_pipeline.tasks.tracking import configure_mlflow


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return tmp_path


def fake_policy(run_dir: Path, name: str) -> Checkpoint:
    """A model directory and the MLflow run that 'trained' it."""
    path = run_dir / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "name": name}))
    configure_mlflow(run_dir, "test")
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_metric("reward", 0.5)
    return Checkpoint(path=str(path), fingerprint=name * 4, run_id=run.info.run_id, parent="sft", stage="grpo-r1")


def result(run_dir: Path, accuracy: float) -> EvalResult:
    details = run_dir / f"details-{accuracy}.json"
    details.write_text(json.dumps({"greedy_correct": [1, 0]}))
    return EvalResult(
        model="m",
        accuracy=accuracy,
        pass_at_k={"1": accuracy},
        num_problems=2,
        n_samples=4,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=5,
        details_path=str(details),
    )


def register(run_dir: Path, name: str, accuracy: float, **cfg):
    config = RegistryConfig(experiment="test", model_name="m", **cfg)
    ctx = RunContext(run_dir=str(run_dir), experiment="test", recipe="test", seed=0)
    return register_policy(
        fake_policy(run_dir, name), result(run_dir, accuracy), None, config, ctx, "name: test\n", {"config_hash": "abc"}
    )


def aliases(version: str) -> list[str]:
    return list(MlflowClient().get_model_version("m", version).aliases)


def test_champion_moves_only_on_improvement(tracking):
    first = register(tracking, "a", 0.50)
    assert (first.version, first.alias, first.previous_champion) == ("1", "champion", None)
    worse = register(tracking, "b", 0.40)
    assert (worse.alias, worse.previous_champion, worse.previous_champion_value) == ("challenger", "1", 0.5)
    tie = register(tracking, "c", 0.50)
    assert tie.alias == "challenger"
    better = register(tracking, "d", 0.60)
    assert better.alias == "champion"
    assert aliases("1") == [] and aliases("4") == ["champion"]
    version = MlflowClient().get_model_version("m", "4")
    assert version.tags["config_hash"] == "abc" and version.tags["gating_value"] == "0.6"
    run = MlflowClient().get_run(version.run_id)
    assert run.data.metrics["eval/accuracy"] == 0.6


def test_min_improvement_margin(tracking):
    register(tracking, "a", 0.50, min_improvement=0.05)
    assert register(tracking, "b", 0.54, min_improvement=0.05).alias == "challenger"
    assert register(tracking, "c", 0.56, min_improvement=0.05).alias == "champion"


def test_bad_gating_metric_touches_nothing(tracking):
    with pytest.raises(ValueError, match="gating_metric 'bleu'"):
        register(tracking, "a", 0.5, gating_metric="bleu")
    assert MlflowClient().search_registered_models() == []


def test_failed_aliasing_leaves_no_version(tracking, monkeypatch):
    register(tracking, "a", 0.5)

    def broken(*args, **kwargs):
        raise RuntimeError("registry went away")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", broken)
    with pytest.raises(RuntimeError, match="went away"):
        register(tracking, "b", 0.9)
    versions = MlflowClient().search_model_versions("name='m'")
    assert [str(v.version) for v in versions] == ["1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_registration_through_a_real_mlflow_server(tmp_path, monkeypatch):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "art"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited"
                assert time.time() < deadline, "mlflow server did not start"
                time.sleep(1)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        first = register(tmp_path / "run", "a", 0.5)
        second = register(tmp_path / "run", "b", 0.7)
        assert (first.alias, second.alias, second.previous_champion) == ("champion", "champion", "1")
        client = MlflowClient(tracking_uri=url)
        champion = client.get_model_version_by_alias("m", "champion")
        assert str(champion.version) == "2"
        local = mlflow.artifacts.download_artifacts("models:/m@champion", dst_path=str(tmp_path / "dl"))
        assert json.loads((Path(local) / "config.json").read_text())["name"] == "b"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
