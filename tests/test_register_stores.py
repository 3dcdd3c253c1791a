"""A registration belongs to one tracking store: rerun with MLFLOW_TRACKING_URI pointed at another store, or after
its version was deleted, the register stage registers again where the run now points, never returning a version
that store does not hold. Two SQLite stores stand in for two tracking servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.core.common import damaged
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.register import TRAINED_IN_TAG, register_policy
from tests.test_register import eval_set, policy, scored


class Stores:
    """Two SQLite stores, A and B, and a run directory whose policy was trained (its MLflow run) against A."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.uri = {name: f"sqlite:///{tmp / f'store-{name}.db'}" for name in "AB"}
        self.monkeypatch = monkeypatch
        self.run_dir = tmp / "run"
        self.run_dir.mkdir()
        self.use("A")
        held_out = eval_set(self.run_dir, 20)
        self.ckpt = policy(self.run_dir, "a")
        self.result = scored(self.run_dir, held_out, [1] * 10 + [0] * 10, "a")
        self.cfg = RegistryConfig(experiment="test", model_name="m")
        self.ctx = RunContext(run_dir=str(self.run_dir), experiment="test", recipe="test", seed=0)

    def use(self, name: str) -> MlflowClient:
        self.monkeypatch.setenv("MLFLOW_TRACKING_URI", self.uri[name])
        return MlflowClient(tracking_uri=self.uri[name])

    def inputs(self) -> dict[str, object]:
        return {"policy": self.ckpt, "result": self.result, "baseline": None, "cfg": self.cfg, "ctx": self.ctx,
                "config_yaml": "name: test\n", "tags": {"round": "1"}}  # fmt: skip

    def key(self) -> str:
        return register_policy.stage.key(self.inputs())


@pytest.fixture
def stores(tmp_path, monkeypatch) -> Stores:
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return Stores(tmp_path, monkeypatch)


def test_the_register_key_names_the_tracking_store(stores):
    in_a = stores.key()
    stores.use("B")
    assert stores.key() != in_a
    stores.use("A")
    assert stores.key() == in_a


def test_a_policy_trained_against_another_store_is_registered_in_this_one_once(stores):
    in_a = register_policy(**stores.inputs())
    b = stores.use("B")
    in_b = register_policy(**stores.inputs())
    version = b.get_model_version("m", in_b.version)  # it is in B
    assert in_b.run_id != stores.ckpt.run_id and version.run_id == in_b.run_id
    assert b.get_run(in_b.run_id).data.tags[TRAINED_IN_TAG] == stores.ckpt.run_id
    assert damaged(in_b) == [] and damaged(in_a) != []  # A's registration is not in B
    again = register_policy(**stores.inputs())  # a retry or rerun finds the same run and version
    assert (again.run_id, again.version, again.existing) == (in_b.run_id, in_b.version, True)
    assert len(b.search_model_versions("name = 'm'")) == 1


def test_a_cached_registration_is_checked_in_its_store(stores):
    registered = register_policy(**stores.inputs())
    assert damaged(registered) == []
    MlflowClient(tracking_uri=stores.uri["A"]).delete_model_version("m", registered.version)
    (problem,) = damaged(registered)
    assert problem == f"models:/m/{registered.version} is not in the MLflow registry at {stores.uri['A']}"


# ----------------------------------------------------------------------------- through the flow's cached stage


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A Prefect server of its own, with results stored under a temporary directory."""
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    results = tmp_path_factory.mktemp("prefect-results")
    with (
        temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results)}),
        prefect_test_harness(server_startup_timeout=None),
    ):
        yield


@pytest.mark.integration
@pytest.mark.slow
def test_a_cached_register_stage_registers_again_in_a_new_store_or_after_a_deletion(stores, prefect_api):
    from prefect import flow

    from grpo_pipeline.flows.stages import Stages, register

    @flow
    def registering() -> tuple[object, bool]:
        run = Stages()
        registration = run("register-r1", register, **stores.inputs())
        return registration, run.records[-1].cached

    first, cached = registering()
    assert not cached
    again, cached = registering()
    assert cached and again == first  # an unchanged rerun hits the cache

    b = stores.use("B")  # the tracking server changed: the stage registers there
    in_b, cached = registering()
    assert not cached and b.get_model_version("m", in_b.version).run_id == in_b.run_id

    a = stores.use("A")  # back to A, whose version was deleted meanwhile: registered again, not the cached one
    a.delete_model_version("m", first.version)
    redone, cached = registering()
    assert not cached and redone.version != first.version
    assert a.get_model_version("m", redone.version).run_id == stores.ckpt.run_id


def test_each_run_directory_keeps_its_own_store_in_one_process(tmp_path, monkeypatch):
    """mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI; the pipeline's own pointing at a store must not, or
    the first run directory a process used becomes every later one's store. A user's own variable still wins."""
    import mlflow

    from grpo_pipeline.tasks.core.tracking import configure_mlflow, tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    try:
        configure_mlflow(first, "one")
        assert "MLFLOW_TRACKING_URI" not in os.environ
        configure_mlflow(second, "two")
        assert mlflow.get_tracking_uri() == tracking_uri(second) == f"sqlite:///{second / 'mlflow.db'}"
        assert (second / "mlflow.db").exists()
        server = f"sqlite:///{tmp_path / 'server.db'}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
        configure_mlflow(first, "one")
        assert os.environ["MLFLOW_TRACKING_URI"] == server == mlflow.get_tracking_uri()
    finally:
        mlflow.set_tracking_uri(None)  # no store of this test's left as the process's


@pytest.mark.parametrize("users", [None, "server"])
def test_threads_pointing_at_stores_at_once_leave_the_environment_as_it_was(tmp_path, monkeypatch, users):
    """Several threads of one process (the flow's Ray fan-out) point MLflow at their run directories' stores at once:
    each gets its own store (or the user's), and MLFLOW_TRACKING_URI ends as it began. Before, one thread could read
    another's store from the variable as the user's choice, and restore it, leaving it set for later runs."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import mlflow

    from grpo_pipeline.tasks.core.tracking import use_store

    server = f"sqlite:///{tmp_path / 'server.db'}"
    if users:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    real = mlflow.set_tracking_uri

    def slow(uri: str | None) -> None:  # a store slow to set up: the window in which the other threads run
        real(uri)
        time.sleep(0.002)

    monkeypatch.setattr(mlflow, "set_tracking_uri", slow)
    dirs = [tmp_path / f"run-{i}" for i in range(4)]
    try:
        with ThreadPoolExecutor(len(dirs)) as pool:
            got = list(pool.map(lambda d: {use_store(d) for _ in range(25)}, dirs))
        assert os.environ.get("MLFLOW_TRACKING_URI") == (server if users else None)
    finally:
        real(None)  # no store of this test's left as the process's
    for run_dir, uris in zip(dirs, got, strict=True):
        assert uris == {server if users else f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"}
