"""The promotion gate decides only on evidence: unscored items, registry errors, stale decisions, concurrent gates.

- Items unscored on either side (None/NaN in items.jsonl, a missing column or key) are left out pairwise; a
  challenger that cannot be scored is `unscored`, registered as challenger only, never "kept champion" with a NaN.
- Only MLflow's "not found" for the model or its `champion` alias means "no champion yet"; any other error on that
  lookup fails the registration (a server error is retried like an outage) and promotes nothing.
- A version left pending by an interrupted registration is compared again with the champion of the moment when the
  champion has changed since its gate tags were written.
- Gating one model is serialised through a Prefect global concurrency limit across every run on the same Prefect
  API, not only runs that share a run directory (the last tests start a Prefect server).

MLflow is a SQLite store under tmp_path, as in tests/test_register.py, whose helpers build real tiny checkpoints.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.flows.stages import retry_registration
from grpo_pipeline.tasks.core.common import Ref
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import configure_mlflow, gate_limit_name, registry_lock, unreachable
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.release.champion import current_champion
from grpo_pipeline.tasks.release.gate import MIN_SCORED_ITEMS, GateDecision, decide, item_metric
from grpo_pipeline.tasks.release.versions import REGISTRATION_TAG
from grpo_pipeline.tasks.scoring.items import item_id
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult, summarize
from tests.test_register import EVAL, eval_set, policy

REWARD = "reward/r"


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return tmp_path


def scored(run_dir: Path, held_out: Ref, values: list[float | None], name: str) -> EvalResult:
    """An EvalResult whose items have the given mean reward `r` (None: the reward gave no score) and greedy
    correctness 1 where that reward is 1."""
    rows = pd.read_parquet(held_out.path)
    items = []
    for p, a, v in zip(rows["prompt"], rows["answer"], values, strict=True):
        ok = int(v == 1)
        items.append(
            {
                "id": item_id(p),
                "prompt": p,
                "answer": a,
                "greedy": a if ok else "x",
                "greedy_correct": ok,
                "samples": [a, "x"],
                "sample_correct": [ok, 0],
                "correct_count": ok,
                "pass_at_k": {"1": ok / 2, "2": float(ok)},
                "maj_at_k": {"1": ok, "2": ok},
                "sample_rewards": {"r": [v, v]},
                "reward_means": {"r": v},
            }
        )
    path = run_dir / f"items-{name}" / ITEMS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return summarize(items, EVAL, name, 0, held_out, path)


def config(**fields: object) -> RegistryConfig:
    return RegistryConfig(experiment="test", model_name="m", **{"gating_metric": REWARD, **fields})


def context(run_dir: Path) -> RunContext:
    return RunContext(run_dir=str(run_dir), experiment="test", recipe="test", seed=0)


def register(run_dir: Path, name: str, values: list[float | None], held_out: Ref, seed: int = 0, **cfg: object):
    ckpt, result = policy(run_dir, name, seed), scored(run_dir, held_out, values, name)
    return register_policy(ckpt, result, None, config(**cfg), context(run_dir), "name: test\n", {})


def champion_version() -> str:
    return str(MlflowClient().get_model_version_by_alias("m", "champion").version)


def gone(*args, **kwargs):
    raise MlflowException("API request failed with exception ConnectionError('connection refused')")


# ----------------------------------------------------------------------------- unscored items


def test_item_metric_marks_none_nan_and_missing_scores_unscored():
    ids = ["a", "b", "c", "d"]
    items = pd.DataFrame(
        {
            "id": ids,
            "greedy_correct": [True, None, False, np.nan],
            "pass_at_k": [{"1": 0.5}, {"1": None}, None, {}],
            "reward_means": [{"r": 0.25}, {"r": None}, {}, np.nan],
        }
    )
    assert item_metric(items, "accuracy").tolist() == pytest.approx([1, np.nan, 0, np.nan], nan_ok=True)
    assert item_metric(items, "pass_at_1").tolist() == pytest.approx([0.5, np.nan, np.nan, np.nan], nan_ok=True)
    assert item_metric(items, REWARD).tolist() == pytest.approx([0.25, np.nan, np.nan, np.nan], nan_ok=True)
    assert item_metric(items, "maj_at_2").isna().all()  # no maj_at_k column at all
    assert list(item_metric(items, "maj_at_2").index) == ids


def test_a_challenger_with_missing_scores_is_unscored_not_kept_champion_with_nan(store):
    """Gating on reward/r, where the reward gave None for most of the challenger's items: not compared."""
    held_out = eval_set(store, 20)
    register(store, "a", [0.0] * 20, held_out)
    challenger = register(store, "b", [1.0] * 5 + [None] * 15, held_out, seed=1)
    gate = challenger.gate
    assert (challenger.alias, gate.decision, gate.promote) == ("challenger", "unscored", False)
    assert (gate.n, gate.n_excluded, gate.champion_version) == (5, 15, "1")
    assert gate.delta is None and gate.ci_low is None and gate.ci_high is None
    assert "only 5 of 20 items have a reward/r score" in gate.reason and "15 unscored for the challenger" in gate.reason
    assert champion_version() == "1"
    tags = MlflowClient().get_model_version("m", challenger.version).tags
    assert (tags["gate.decision"], tags["gate.unscored"], tags["gate.n_excluded"]) == ("unscored", "True", "15")
    assert "only 5 of 20 items" in tags["gate.reason"]
    assert "nan" not in " ".join(v for k, v in tags.items() if k.startswith("gate.")).lower()


def test_items_unscored_on_either_side_are_left_out_pairwise(store):
    held_out = eval_set(store, 40)
    champion_scores: list[float | None] = [0.0] * 40
    champion_scores[0] = champion_scores[1] = None  # the champion's reward failed on two items
    register(store, "a", champion_scores, held_out)
    ours: list[float | None] = [1.0] * 30 + [0.0] * 10
    ours[2] = ours[3] = ours[4] = None  # and the challenger's on three others
    better = register(store, "b", ours, held_out, seed=1)
    gate = better.gate
    assert (gate.n, gate.n_excluded) == (35, 5)
    pairs = [(c, o) for c, o in zip(champion_scores, ours, strict=True) if c is not None and o is not None]
    assert gate.delta == pytest.approx(np.mean([o - c for c, o in pairs]))
    assert gate.challenger == pytest.approx(np.mean([o for _, o in pairs])) and gate.champion == 0.0
    assert (better.alias, gate.decision) == ("champion", "promoted")
    assert "on the same 35 items (5 unscored left out)" in gate.explain()


def test_a_first_version_that_cannot_be_scored_is_not_champion(store):
    held_out = eval_set(store, 20)
    unscored = register(store, "a", [1.0] * 15 + [None] * 5, held_out)  # 25% unscored: more than the gate takes
    assert (unscored.alias, unscored.gate.decision, unscored.gate.champion_version) == ("challenger", "unscored", None)
    assert "at most 20% unscored" in unscored.gate.reason
    first = register(store, "b", [0.0] * 18 + [None] * 2, held_out, seed=1)  # 10% unscored: decided on 18 items
    assert (first.alias, first.gate.decision, first.gate.n, first.gate.n_excluded) == ("champion", "first", 18, 2)


def test_too_few_items_for_a_paired_comparison_decide_nothing(store):
    """Every item scored, but fewer than the gate's minimum: no comparison (the challenger is better on each)."""
    held_out = eval_set(store, MIN_SCORED_ITEMS - 1)
    configure_mlflow(store, "test")
    ctx, cfg = context(store), config()
    result = scored(store, held_out, [1.0] * (MIN_SCORED_ITEMS - 1), "b")
    gate = decide(MlflowClient(), cfg, result, result.items(), ctx)  # no champion: not even a first version
    assert (gate.decision, gate.n) == ("unscored", MIN_SCORED_ITEMS - 1)
    assert GateDecision.from_tags(gate.tags()) == gate  # what the version's tags give back
    assert gate.explain().startswith("reward/r not compared: only 9 of 9 items")


# ----------------------------------------------------------------------------- the champion lookup


def test_only_not_found_means_no_champion(store, monkeypatch):
    configure_mlflow(store, "test")
    client = MlflowClient()
    assert current_champion(client, "m") is None  # no such model (RESOURCE_DOES_NOT_EXIST)
    client.create_registered_model("m")
    assert current_champion(client, "m") is None  # no such alias (INVALID_PARAMETER_VALUE, "alias ... not found")

    held_out = eval_set(store, 10)
    register(store, "a", [0.0] * 10, held_out)
    assert str(current_champion(client, "m").version) == "1"

    def bad_request(*args, **kwargs):  # the same code as a missing alias, for another reason
        raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "malformed request"})

    monkeypatch.setattr(MlflowClient, "get_model_version_by_alias", bad_request)
    with pytest.raises(MlflowException, match="malformed request"):
        current_champion(client, "m")


def failing_state(error: BaseException) -> SimpleNamespace:
    def result():
        raise error

    return SimpleNamespace(result=result)


def test_a_server_error_on_the_champion_lookup_is_retried_and_promotes_nothing(store, monkeypatch):
    held_out = eval_set(store, 40)
    register(store, "a", [0.0] * 40, held_out)
    ckpt, result = policy(store, "b", seed=1), scored(store, held_out, [1.0] * 40, "b")

    def server_error(*args, **kwargs):
        raise RestException({"error_code": "INTERNAL_ERROR", "message": "database is locked"})

    with monkeypatch.context() as broken:
        broken.setattr(MlflowClient, "get_model_version_by_alias", server_error)
        with pytest.raises(MlflowException, match="database is locked") as failed:
            register_policy(ckpt, result, None, config(), context(store), "name: test\n", {})
    assert [str(v.version) for v in MlflowClient().search_model_versions("name='m'")] == ["1"]
    assert champion_version() == "1"
    # retried through every delay of the register stage, like an unreachable server
    assert unreachable(failed.value)
    assert retry_registration(None, SimpleNamespace(run_count=6), failing_state(failed.value))

    # the server answers again: the retry compares with the champion, it is not a "first version"
    again = register_policy(ckpt, result, None, config(), context(store), "name: test\n", {})
    assert (again.version, again.alias, again.gate.decision, again.gate.champion_version) == (
        "2",
        "champion",
        "promoted",
        "1",
    )


def test_a_refused_permission_on_the_champion_lookup_fails_the_registration(store, monkeypatch):
    held_out = eval_set(store, 20)
    register(store, "a", [0.0] * 20, held_out)

    def forbidden(*args, **kwargs):
        raise RestException({"error_code": "PERMISSION_DENIED", "message": "user may not read model m"})

    monkeypatch.setattr(MlflowClient, "get_model_version_by_alias", forbidden)
    with pytest.raises(MlflowException, match="may not read") as failed:
        register(store, "b", [1.0] * 20, held_out, seed=1)
    assert not unreachable(failed.value)  # not an outage: retried only as often as any stage's failure
    assert [str(v.version) for v in MlflowClient().search_model_versions("name='m'")] == ["1"]


def test_server_errors_are_an_outage_and_client_errors_are_not():
    import requests

    try:
        try:
            raise requests.exceptions.RetryError("Max retries exceeded (too many 500 error responses)")
        except requests.exceptions.RetryError as cause:
            raise MlflowException(f"API request to http://mlflow/api failed with exception {cause}")  # noqa: B904 as MLflow does
    except MlflowException as wrapped:
        assert unreachable(wrapped)  # MLflow's own client gave up on repeated 5xx answers
    assert unreachable(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try later"}))
    assert unreachable(RestException({"error_code": "INTERNAL_ERROR", "message": "database is locked"}))
    assert not unreachable(RestException({"error_code": "PERMISSION_DENIED", "message": "no"}))
    assert not unreachable(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such model"}))


# ----------------------------------------------------------------------------- a pending version finished later


def test_a_pending_version_finished_after_another_took_champion_is_compared_again(store, monkeypatch):
    """B is gated against v1 and promoted, but the server goes away before its alias is set: v2 stays pending. C is
    then gated against v1 (still the champion) and promoted as v3. B's retry compares v2 with v3, not v1: it is
    worse than v3, so it stays challenger and v3 keeps champion."""
    held_out = eval_set(store, 40)
    register(store, "a", [0.0] * 40, held_out)
    ckpt, result = policy(store, "b", seed=1), scored(store, held_out, [1.0] * 20 + [0.0] * 20, "b")
    with monkeypatch.context() as broken:
        broken.setattr(MlflowClient, "set_registered_model_alias", gone)
        broken.setattr(MlflowClient, "delete_model_version", gone)
        with pytest.raises(MlflowException, match="connection refused"):
            register_policy(ckpt, result, None, config(), context(store), "name: test\n", {})
    client = MlflowClient()
    pending = client.get_model_version("m", "2")
    assert pending.tags[REGISTRATION_TAG] == "pending" and pending.aliases == []
    assert (pending.tags["gate.promote"], pending.tags["gate.champion_version"]) == ("True", "1")

    best = register(store, "c", [1.0] * 40, held_out, seed=2)
    assert (best.version, best.alias, best.gate.champion_version) == ("3", "champion", "1")

    again = register_policy(ckpt, result, None, config(), context(store), "name: test\n", {})
    assert (again.version, again.existing, again.alias) == ("2", True, "challenger")
    assert (again.gate.decision, again.gate.champion_version, again.gate.promote) == ("kept champion", "3", False)
    assert again.gate.ci_high < 0
    assert champion_version() == "3"
    finished = client.get_model_version("m", "2")
    assert (finished.aliases, finished.tags[REGISTRATION_TAG]) == (["challenger"], "finished")
    assert finished.tags["gate.decision"] == "kept champion" and finished.tags["gate.champion_version"] == "3"
    assert "vs champion v3" in finished.description
    assert client.get_run(ckpt.run_id).data.tags["gate.champion_version"] == "3"  # the run says the same


def test_a_pending_version_whose_champion_is_unchanged_keeps_its_decision(store, monkeypatch):
    held_out = eval_set(store, 40)
    register(store, "a", [0.0] * 40, held_out)
    ckpt, result = policy(store, "b", seed=1), scored(store, held_out, [1.0] * 40, "b")
    with monkeypatch.context() as broken:
        broken.setattr(MlflowClient, "set_registered_model_alias", gone)
        broken.setattr(MlflowClient, "delete_model_version", gone)
        with pytest.raises(MlflowException, match="connection refused"):
            register_policy(ckpt, result, None, config(), context(store), "name: test\n", {})
    compared = []
    monkeypatch.setattr("grpo_pipeline.tasks.register.decide", lambda *a, **k: compared.append(a))
    again = register_policy(ckpt, result, None, config(), context(store), "name: test\n", {})
    assert compared == []  # its tags still speak for the current champion
    assert (again.alias, again.gate.decision, again.gate.champion_version) == ("champion", "promoted", "1")


# ----------------------------------------------------------------------------- serialised through the Prefect API


def test_limit_names_are_valid_prefect_names():
    assert gate_limit_name("tiny-arith-grpo") == "grpo-pipeline-gate-tiny-arith-grpo"
    odd = gate_limit_name("team/model<2>")
    assert odd.startswith("grpo-pipeline-gate-team_model_2_-") and not set("/%&<>") & set(odd)
    assert odd != gate_limit_name("team_model_2_")


@pytest.fixture(scope="module")
def prefect_api():
    """A Prefect server of its own (PREFECT_API_URL points at it while the tests run)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):
        yield


def limit_state(model: str) -> tuple[int, int]:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(gate_limit_name(model))
    return limit.limit, limit.active_slots


@pytest.mark.integration
def test_two_gates_of_one_model_wait_for_each_other_through_the_prefect_api(tmp_path, monkeypatch, prefect_api):
    """Two runs with their own run directories that share a tracking server and a Prefect API: the second waits
    while the first holds the model's slot, and goes on once it is released."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")  # shared; the lock does not call it
    from grpo_pipeline.tasks.core import tracking

    events: list[str] = []
    first_in, release, second_waits, second_in = (threading.Event() for _ in range(4))

    class Waiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for another run gating" in record.getMessage():
                events.append("second waits")
                second_waits.set()

    def gate(run_dir: Path, entered: threading.Event, label: str, hold: threading.Event | None = None) -> None:
        with registry_lock(run_dir, "shared-model"):
            events.append(f"{label} in")
            entered.set()
            if hold is not None:
                hold.wait(timeout=300)
            events.append(f"{label} out")

    handler = Waiting()
    tracking.logger.addHandler(handler)
    monkeypatch.setattr(tracking.logger, "level", logging.INFO)
    try:
        first = threading.Thread(target=gate, args=(tmp_path / "run-a", first_in, "first", release), daemon=True)
        first.start()
        assert first_in.wait(timeout=300), "the first gate never got the slot"
        second = threading.Thread(target=gate, args=(tmp_path / "run-b", second_in, "second"), daemon=True)
        second.start()
        deadline = time.monotonic() + 300
        while not (second_waits.is_set() or second_in.is_set()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not second_in.is_set(), events  # it did not go in while the first held the slot
        assert second_waits.is_set(), events
        assert limit_state("shared-model") == (1, 1)  # the first one's slot
        release.set()
        first.join(timeout=300)
        second.join(timeout=300)
    finally:
        release.set()
        tracking.logger.removeHandler(handler)
    assert events == ["first in", "second waits", "first out", "second in", "second out"]
    assert limit_state("shared-model") == (1, 0)


@pytest.mark.integration
def test_registration_holds_the_slot_from_reading_the_champion_to_moving_the_alias(store, monkeypatch, prefect_api):
    held_out = eval_set(store, 20)
    seen: dict[str, tuple[int, int]] = {}
    lookup, alias = MlflowClient.get_model_version_by_alias, MlflowClient.set_registered_model_alias

    def looked_up(self, *args, **kwargs):
        seen["champion read"] = limit_state("m")
        return lookup(self, *args, **kwargs)

    def aliased(self, *args, **kwargs):
        seen["alias set"] = limit_state("m")
        return alias(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "get_model_version_by_alias", looked_up)
    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", aliased)
    first = register(store, "a", [0.0] * 20, held_out)
    assert first.gate.decision == "first"
    assert seen == {"champion read": (1, 1), "alias set": (1, 1)}
    assert limit_state("m") == (1, 0)


@pytest.mark.integration
def test_a_limit_that_lets_two_runs_in_is_refused(tmp_path, prefect_api):
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=gate_limit_name("wide"), limit=2))
    with pytest.raises(ValueError, match="has 2 slot"), registry_lock(tmp_path, "wide"):
        pass


@pytest.mark.integration
def test_a_registration_task_in_a_flow_run_holds_the_slot(tmp_path, prefect_api):
    from prefect import flow, task

    @task
    def gate() -> tuple[int, int]:
        with registry_lock(tmp_path, "in-flow"):
            return limit_state("in-flow")

    @flow
    def pipeline() -> tuple[int, int]:
        return gate()

    assert pipeline() == (1, 1)
    assert limit_state("in-flow") == (1, 0)
