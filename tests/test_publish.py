"""Checkpoints across machines: publish to the MLflow artifact store, fetch back where the path is not local."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest

from grpo_pipeline.tasks.core.common import Checkpoint, Ref, fingerprint_path
from grpo_pipeline.tasks.core.publish import materialize, publish, share_inputs
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import configure_mlflow


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
    ckpt = Checkpoint(path=str(model), fingerprint=fingerprint_path(model), run_id=run.info.run_id, stage="grpo-round1")
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
    from grpo_pipeline.tasks.release.registered import resolve_registered

    with pytest.raises(ValueError, match="models:/<name>@<alias>"):
        resolve_registered(uri, str(tmp_path))


def test_a_missing_registered_model_names_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_pipeline.tasks.release.registered import resolve_registered

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(FileNotFoundError, match=r"models:/nope@champion.*no such registered model version"):
        resolve_registered("models:/nope@champion", str(tmp_path))


def test_a_data_file_from_another_machine_is_fetched_with_its_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = tmp_path / "pipeline" / "data" / "train.parquet"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"PAR1 rows PAR1")
    configure_mlflow(tmp_path, "publish")
    with mlflow.start_run() as run:
        pass
    ref = publish(Ref(path=str(data), fingerprint=fingerprint_path(data)), str(tmp_path), "publish", run.info.run_id)
    assert ref.uri == f"runs:/{run.info.run_id}/inputs/{ref.fingerprint[:12]}/train.parquet"
    data.unlink()
    local = materialize(ref, str(tmp_path))
    assert Path(local.path).name == "train.parquet" and Path(local.path).read_bytes() == b"PAR1 rows PAR1"
    assert fingerprint_path(local.path) == ref.fingerprint


def test_share_inputs_publishes_what_a_worker_elsewhere_needs_once(tmp_path: Path, published: Checkpoint) -> None:
    sft_dir = tmp_path / "sft"
    sft_dir.mkdir()
    (sft_dir / "config.json").write_text("{}")
    with mlflow.start_run() as run:
        pass
    start = Checkpoint(path=str(sft_dir), fingerprint=fingerprint_path(sft_dir), run_id=run.info.run_id, stage="sft")
    train = tmp_path / "train.parquet"
    train.write_bytes(b"train rows")
    refs = [Ref(path=str(train), fingerprint=fingerprint_path(train)), None]
    ctx = RunContext(run_dir=str(tmp_path), experiment="publish", recipe="t", seed=0)

    shared_start, (shared_train, none) = share_inputs(start, refs, ctx, "grpo-round1")
    assert shared_start.uri == f"runs:/{run.info.run_id}/checkpoint"  # the checkpoint goes to its own run
    assert shared_train.uri is not None and "/inputs/" in shared_train.uri and none is None
    inputs_run = mlflow.get_run(shared_train.uri.split("/")[1])
    assert inputs_run.info.run_name == "t-grpo-round1-inputs"
    # what already has a URI (a round's published checkpoint) is not published again; a hub model never is
    again_start, (again_train, _) = share_inputs(published, [shared_train, None], ctx, "grpo-round2")
    assert (again_start, again_train) == (published, shared_train)
    hub = Checkpoint(path="org/model", fingerprint="hub:org/model")
    assert share_inputs(hub, [], ctx, "x") == (hub, []) and materialize(hub, str(tmp_path)) == hub


def test_an_alias_base_is_pinned_to_one_version_for_the_whole_run(tmp_path: Path, monkeypatch) -> None:
    from grpo_pipeline.configs.schema import ModelConfig
    from grpo_pipeline.tasks.model import pin_registered

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    configure_mlflow(tmp_path, "pin")
    client = mlflow.MlflowClient()
    client.create_registered_model("base-model")
    for _ in range(2):
        client.create_model_version("base-model", source=str(tmp_path))
    client.set_registered_model_alias("base-model", "champion", "2")
    pinned = pin_registered(ModelConfig(base="models:/base-model@champion"), str(tmp_path))
    assert pinned.base == "models:/base-model/2"
    client.set_registered_model_alias("base-model", "champion", "1")  # the alias moves; the pinned config does not
    assert pinned.base == "models:/base-model/2"
    for unchanged in ("tiny", "models:/base-model/1", str(tmp_path)):
        assert pin_registered(ModelConfig(base=unchanged), str(tmp_path)).base == unchanged
