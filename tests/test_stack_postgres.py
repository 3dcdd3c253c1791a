"""The stack a team runs, on PostgreSQL: `grpo-pipeline serve --prefect-db ... --mlflow-db ...` against a private
PostgreSQL server (conftest's `postgres`), and the stack tests that write records run once against it: a deployment
run with GPU routing that registers through MLflow, the nightly run, and two runs registering at once. SQLite stays
the embedded default (tests/test_stack_integration.py runs every stack test on it)."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grpo_pipeline.stack import Stack
from tests.helpers import cli_env, micro_overrides, run_cli, serve_stack
from tests.test_stack_integration import (  # collected here too, with this module's `stack`
    test_local_deployment_sends_grpo_to_the_gpu_pool_and_registers_through_mlflow,  # noqa: F401
    test_nightly_is_scheduled_inactive_continues_from_the_champion_and_caches,  # noqa: F401
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def databases(postgres) -> dict[str, str]:
    return {server: postgres.new_database(f"{server}_{uuid.uuid4().hex[:8]}") for server in ("prefect", "mlflow")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, databases) -> Iterator[Stack]:
    args = ["--prefect-db", databases["prefect"], "--mlflow-db", databases["mlflow"]]
    with serve_stack(tmp_path_factory.mktemp("pg-stack"), *args) as started:
        yield started


def rows(url: str, query: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def test_both_servers_keep_their_records_in_postgresql(stack: Stack, databases: dict[str, str]) -> None:
    assert stack.databases["prefect"].startswith("postgresql+asyncpg://grpo@")  # recorded without a password
    assert stack.databases["mlflow"].startswith("postgresql+psycopg://grpo@")
    assert not (Path(stack.state_dir) / "mlflow.db").exists()
    assert not list((Path(stack.state_dir) / "prefect").glob("*.db"))
    # the work pools and deployments `serve` created are rows of PostgreSQL's Prefect database
    assert {"cpu", "gpu"} <= {name for (name,) in rows(databases["prefect"], "SELECT name FROM work_pool")}
    deployments = {name for (name,) in rows(databases["prefect"], "SELECT name FROM deployment")}
    assert {"local", "nightly", "gpu"} <= deployments


def test_two_runs_registering_at_once_end_with_one_champion(stack: Stack, databases: dict[str, str], tmp_path):
    """Two pipeline runs on the stack (each its own run directory, as on two machines) gate the same model at once;
    the gate's global concurrency slot lives in PostgreSQL now. Each registers one version; one champion."""
    model = "pg-concurrent"
    results: dict[int, subprocess.CompletedProcess] = {}

    def run(seed: int) -> None:
        store = tmp_path / f"run-{seed}"
        env = cli_env(store, **stack.client_env())
        args = ["run", "--config", "configs/tiny-arith.yaml", *micro_overrides(store / "runs"),
                f"registry.model_name={model}", f"seed={seed}", "grpo.steps_per_round=1"]  # fmt: skip
        results[seed] = run_cli(args, env)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (21, 22)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for seed, result in results.items():
        assert result.returncode == 0, (seed, (result.stdout + result.stderr)[-3000:])
    versions = httpx.get(
        f"{stack.mlflow_url}/api/2.0/mlflow/model-versions/search", params={"filter": f"name='{model}'"}
    ).json()["model_versions"]
    assert sorted(v["version"] for v in versions) == ["1", "2"]
    aliases = [
        httpx.get(
            f"{stack.mlflow_url}/api/2.0/mlflow/model-versions/get", params={"name": model, "version": v["version"]}
        )
        .json()["model_version"]
        .get("aliases", [])
        for v in versions
    ]
    assert sorted(a for per in aliases for a in per if a == "champion") == ["champion"], aliases
    # what the MLflow UI reads comes from PostgreSQL
    assert rows(databases["mlflow"], f"SELECT count(*) FROM model_versions WHERE name = '{model}'") == [(2,)]
