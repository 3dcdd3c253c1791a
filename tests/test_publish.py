"""Checkpoints across machines: publish to the MLflow artifact store, fetch back where the path is not local."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest

from grpo_pipeline.tasks.common import Checkpoint, fingerprint_path
from grpo_pipeline.tasks.publish import materialize, publish
from grpo_pipeline.tasks.tracking import configure_mlflow


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Checkpoint:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model = tmp_path / "worker" / "grpo-round1" / "abc"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\x00weights" * 100)
    configure_mlflow(tmp_path, "publish")
    with mlflow.start_run() as run:
        pass
    ckpt = Checkpoint(path=str(model), fingerprint=fingerprint_path(model), run_id=run.info.run_id, stage="grpo-r1")
    return publish(ckpt, str(tmp_path), "publish")


def test_a_local_checkpoint_is_used_as_it_is(published: Checkpoint, tmp_path: Path) -> None:
    assert published.uri == f"runs:/{published.run_id}/checkpoint"
    assert materialize(published, str(tmp_path)) == published


def test_a_checkpoint_from_another_machine_is_fetched_and_verified(published: Checkpoint, tmp_path: Path) -> None:
    shutil.rmtree(published.path)  # the worker's disk is not this machine's
    local = materialize(published, str(tmp_path))
    assert Path(local.path).parent == tmp_path.resolve() / "fetched"
    assert fingerprint_path(local.path) == published.fingerprint
    assert materialize(published, str(tmp_path)).path == local.path  # a second fetch reuses the verified copy


def test_a_fetched_checkpoint_with_other_content_is_refused(published: Checkpoint, tmp_path: Path) -> None:
    shutil.rmtree(published.path)
    forged = published.model_copy(update={"fingerprint": "0" * 64})
    with pytest.raises(ValueError, match="fingerprint"):
        materialize(forged, str(tmp_path))
    assert not (tmp_path / "fetched" / ("0" * 12)).exists()  # nothing half-fetched is left where it would be used


def test_an_unpublished_missing_checkpoint_says_so(tmp_path: Path) -> None:
    ckpt = Checkpoint(path=str(tmp_path / "gone"), fingerprint="f" * 64)
    with pytest.raises(FileNotFoundError, match="not published"):
        materialize(ckpt, str(tmp_path))


@pytest.mark.parametrize("uri", ["models:/", "models:/name", "models:/name/latest", "models:/@champion"])
def test_a_malformed_registry_base_is_refused(uri: str, tmp_path: Path) -> None:
    from grpo_pipeline.tasks.model import resolve_registered

    with pytest.raises(ValueError, match="models:/<name>@<alias>"):
        resolve_registered(uri, str(tmp_path))


def test_a_missing_registered_model_names_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_pipeline.tasks.model import resolve_registered

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(FileNotFoundError, match=r"models:/nope@champion.*no such registered model version"):
        resolve_registered("models:/nope@champion", str(tmp_path))
