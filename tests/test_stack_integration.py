"""The stack as users run it: `grpo-pipeline serve` on free loopback ports, deployments run with the `prefect` CLI
through the workers, checked through the Prefect and MLflow REST APIs, and `grpo-pipeline stop`.

One module-scoped stack serves every test; its teardown stops it and checks that no process it started is left,
also when a test failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grpo_pipeline.stack import Stack
from tests.helpers import ROOT, cli_env, micro_overrides, serve_stack

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
MODEL = "stack-micro"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with serve_stack(tmp_path_factory.mktemp("stack")) as started:
        yield started


def prefect_cli(stack: Stack, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**cli_env(Path(stack.state_dir)), **stack.client_env()}
    return subprocess.run([str(BIN / "prefect"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def api(stack: Stack, method: str, path: str, body: dict | None = None) -> object:
    r = httpx.request(method, f"{stack.prefect_api_url}{path}", json=body, timeout=30)
    r.raise_for_status()
    return r.json()


def flow_runs(stack: Stack, flow_name: str) -> list[dict]:
    body = {"flows": {"name": {"any_": [flow_name]}}, "sort": "START_TIME_DESC"}
    return api(stack, "POST", "/flow_runs/filter", body)


def run_deployment(stack: Stack, name: str, overrides: list[str]) -> dict:
    """Run a deployment through its worker with `prefect deployment run --watch`; returns the flow run."""
    params = json.dumps({"overrides": overrides})
    proc = prefect_cli(stack, "deployment", "run", name, "--params", params, "--watch", "--watch-interval", "1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    flow_run_id = next(line.split()[-1] for line in proc.stdout.splitlines() if "UUID:" in line)
    return api(stack, "GET", f"/flow_runs/{flow_run_id}")


def task_states(stack: Stack, flow_run_id: str) -> dict[str, str]:
    runs = api(stack, "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
    return {r["name"]: r["state_name"] for r in runs}


def micro(stack: Stack, *extra: str) -> list[str]:
    return [*micro_overrides(Path(stack.state_dir) / "runs"), f"registry.model_name={MODEL}", *extra]


def test_local_deployment_sends_grpo_to_the_gpu_pool_and_registers_through_mlflow(stack: Stack) -> None:
    parent = run_deployment(stack, "grpo-pipeline/local", micro(stack, "grpo.work_pool=gpu"))
    assert parent["state_type"] == "COMPLETED" and parent["work_pool_name"] == "cpu"
    children = [r for r in flow_runs(stack, "grpo-train") if r["parent_task_run_id"]]
    assert children and children[0]["work_pool_name"] == "gpu" and children[0]["state_type"] == "COMPLETED"

    # what the Prefect UI shows: summary, score table and training progress as artifacts, the stages' own logs
    artifacts = api(stack, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [parent["id"]]}}})
    assert {"grpo-pipeline-summary", "grpo-pipeline-scores", "sft-progress"} <= {a["key"] for a in artifacts}
    child_artifacts = api(
        stack, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [children[0]["id"]]}}}
    )
    assert any(a["key"] == "grpo-round1-progress" and a["data"] == 100.0 for a in child_artifacts), child_artifacts
    logs = api(stack, "POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [parent["id"]]}}, "limit": 200})
    assert any(log["name"] == "grpo_pipeline" and "eval r1: accuracy" in log["message"] for log in logs)

    versions = httpx.get(
        f"{stack.mlflow_url}/api/2.0/mlflow/model-versions/search", params={"filter": f"name='{MODEL}'"}
    ).json()["model_versions"]
    assert [v["version"] for v in versions] == ["1"]
    source = versions[0]["source"]
    assert source.startswith("models:/m-"), source  # an MLflow (logged) model
    model = httpx.get(f"{stack.mlflow_url}/api/2.0/mlflow/logged-models/{source.removeprefix('models:/')}").json()
    artifacts = model["model"]["info"]["artifact_uri"]
    assert artifacts.startswith("mlflow-artifacts:/"), artifacts  # stored by the server, not a local path
    # the model's files come back over HTTP from the server's artifact proxy
    path = artifacts.removeprefix("mlflow-artifacts:/")
    config = httpx.get(f"{stack.mlflow_url}/api/2.0/mlflow-artifacts/artifacts/{path}/model/config.json")
    assert config.status_code == 200 and config.json()["model_type"] == "llama"


def test_a_second_serve_says_the_stack_is_up(stack: Stack) -> None:
    proc = subprocess.run(
        [str(BIN / "grpo-pipeline"), "serve", "--state-dir", stack.state_dir],
        cwd=ROOT, env=cli_env(Path(stack.state_dir)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1 and "already up" in proc.stdout
    status = subprocess.run(
        [str(BIN / "grpo-pipeline"), "status", "--state-dir", stack.state_dir, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert all(json.loads(status.stdout)["alive"].values())


def test_deployment_parameters_are_a_typed_form_with_help(stack: Stack) -> None:
    schema = api(stack, "GET", "/deployments/name/grpo-pipeline/local")["parameter_openapi_schema"]
    assert set(schema["properties"]) == {"config", "recipe", "overrides"}
    grpo = schema["definitions"]["GRPOStageConfig"]["properties"]
    assert "prompts_per_step" in grpo and "Distinct prompts" in grpo["prompts_per_step"]["description"]


def champion_version(stack: Stack) -> str | None:
    r = httpx.get(
        f"{stack.mlflow_url}/api/2.0/mlflow/registered-models/alias", params={"name": MODEL, "alias": "champion"}
    )
    return r.json()["model_version"]["version"] if r.is_success else None


def test_nightly_is_scheduled_inactive_continues_from_the_champion_and_caches(stack: Stack) -> None:
    nightly = api(stack, "GET", "/deployments/name/grpo-pipeline/nightly")
    assert [(s["schedule"]["cron"], s["active"]) for s in nightly["schedules"]] == [("0 3 * * *", False)]
    champion = f"models:/{MODEL}@champion"
    if champion_version(stack) is None:
        run_deployment(stack, "grpo-pipeline/local", micro(stack))  # this test alone: register a champion first
    version = champion_version(stack)

    overrides = micro(stack, f"model.base={champion}", "sft.enabled=false")
    first = run_deployment(stack, "grpo-pipeline/nightly", overrides)
    assert first["state_type"] == "COMPLETED"
    assert "sft_warmup" not in {n.split("-")[0] for n in task_states(stack, first["id"])}
    newest = httpx.get(
        f"{stack.mlflow_url}/api/2.0/mlflow/model-versions/search", params={"filter": f"name='{MODEL}'"}
    ).json()["model_versions"]
    tags = {t["key"]: t["value"] for t in max(newest, key=lambda v: int(v["version"]))["tags"]}
    assert tags["parent_model"] == f"models:/{MODEL}/{version}"

    second = run_deployment(stack, "grpo-pipeline/nightly", overrides)
    states = task_states(stack, second["id"])
    if champion_version(stack) == version:  # neither the data nor the champion changed: every stage is cached;
        # only pin_model runs again, as in every run, to resolve the champion alias to the version it names now
        assert {state for name, state in states.items() if not name.startswith("pin_model")} == {"Cached"}, states
        assert any(name.startswith("pin_model") for name in states), states


def test_cancelling_the_pipeline_cancels_its_grpo_child(stack: Stack) -> None:
    params = json.dumps({"overrides": micro(stack, "grpo.work_pool=gpu", "grpo.steps_per_round=5000", "seed=7")})
    proc = prefect_cli(stack, "deployment", "run", "grpo-pipeline/local", "--params", params)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parent_id = next(line.split()[-1] for line in proc.stdout.splitlines() if "UUID:" in line)

    def child() -> dict | None:
        runs = [r for r in flow_runs(stack, "grpo-train") if r["state_type"] in ("RUNNING", "CANCELLING", "CANCELLED")]
        mine = [r for r in runs if r["parameters"].get("spec", {}).get("ctx", {}).get("seed") == 7]
        return mine[0] if mine else None

    deadline = time.monotonic() + 300
    while (c := child()) is None or c["state_type"] != "RUNNING":
        assert time.monotonic() < deadline, "the GRPO child never started"
        time.sleep(2)
    cancel = prefect_cli(stack, "flow-run", "cancel", parent_id, timeout=60)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    deadline = time.monotonic() + 240
    while True:
        states = (api(stack, "GET", f"/flow_runs/{parent_id}")["state_type"], child()["state_type"])
        if states == ("CANCELLED", "CANCELLED"):
            break
        assert time.monotonic() < deadline, f"parent and child ended as {states}"
        time.sleep(2)


EXPLODING_REWARD = """
def explode(prompts, completions, trainer_state=None, **kwargs):
    if trainer_state is not None:  # TRL passes its state: this is GRPO training, in the child run
        raise ValueError("reward exploded during training")  # not retried: one child run fails the parent
    return [0.0 for _ in completions]
"""


def test_a_failed_grpo_child_fails_the_pipeline_with_its_error(stack: Stack, tmp_path: Path) -> None:
    """The child on the gpu pool imports the user's reward from beside the recipe, fails in training, and the
    parent fails with the child's error instead of carrying on."""
    (tmp_path / "exploding.py").write_text(EXPLODING_REWARD)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((ROOT / "configs/tiny-arith.yaml").read_text())
    overrides = micro(stack, "grpo.work_pool=gpu", "grpo.rewards=[{name: 'exploding:explode'}]", "seed=11")
    params = json.dumps({"recipe": str(recipe), "overrides": overrides})
    proc = prefect_cli(
        stack, "deployment", "run", "grpo-pipeline/local", "--params", params, "--watch", "--watch-interval", "1"
    )
    parent_id = next(line.split()[-1] for line in proc.stdout.splitlines() if "UUID:" in line)
    parent = api(stack, "GET", f"/flow_runs/{parent_id}")
    assert parent["state_type"] == "FAILED", parent["state"]
    child = [
        r for r in flow_runs(stack, "grpo-train") if r["parameters"].get("spec", {}).get("ctx", {}).get("seed") == 11
    ]
    assert child and child[0]["state_type"] == "FAILED" and child[0]["work_pool_name"] == "gpu"
    logs = api(stack, "POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [parent_id]}}, "limit": 200})
    assert any("reward exploded during training" in log["message"] for log in logs), [log["message"] for log in logs]
    assert "register-r1" not in {name for name in task_states(stack, parent_id)}


def isolated_worker(stack: Stack, home: Path) -> tuple[subprocess.Popen, bool]:
    """A `gpu` pool worker that shares nothing with the pipeline but the two servers' URLs: its own directory,
    Prefect home and result storage and, where mount namespaces are allowed, the stack's state directory (the
    pipeline's run directory and result storage) hidden under an empty tmpfs, and its result storage on a tmpfs of
    its own that the pipeline cannot read."""
    private = home / "private"
    private.mkdir(parents=True)
    env = {
        **cli_env(
            home, PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_LOGGING_EXTRA_LOGGERS="grpo_pipeline"
        ),  # as the image
        "PREFECT_API_URL": stack.prefect_api_url,
        "MLFLOW_TRACKING_URI": stack.mlflow_url,
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(private / "results"),
    }
    worker = [str(BIN / "prefect"), "worker", "start", "--pool", "gpu", "--name", "isolated-gpu"]
    mounts = 'for d in "$0" "$1"; do mount -t tmpfs tmpfs "$d" || exit 1; done; shift; exec "$@"'
    hide = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mounts, stack.state_dir, str(private)]
    namespaces = subprocess.run([*hide[:5], "true"], capture_output=True).returncode == 0
    log = open(home / "worker.log", "w")  # noqa: SIM115 (the worker's own; closed with the process)
    proc = subprocess.Popen([*(hide if namespaces else []), *worker], cwd=home, env=env, stdout=log, stderr=log,
                            start_new_session=True)  # fmt: skip
    return proc, namespaces


def test_a_gpu_worker_that_shares_nothing_but_the_two_urls(stack: Stack, tmp_path: Path) -> None:
    """The round's inputs reach the worker through MLflow and its result comes back through MLflow: the worker
    cannot read the pipeline's run directory and has its own Prefect result storage (runs last: it replaces the
    stack's gpu worker)."""
    from grpo_pipeline.stack import stop_services

    gpu = [s for s in stack.services if s.name == "worker-gpu"]
    stop_services(stack.model_copy(update={"services": gpu}))
    worker, hidden = isolated_worker(stack, tmp_path / "worker")
    try:
        parent = run_deployment(stack, "grpo-pipeline/local", micro(stack, "grpo.work_pool=gpu", "seed=13"))
        assert parent["state_type"] == "COMPLETED", parent["state"]
        child = [
            r
            for r in flow_runs(stack, "grpo-train")
            if r["parameters"].get("spec", {}).get("ctx", {}).get("seed") == 13
        ]
        assert child and child[0]["state_type"] == "COMPLETED", child
        assert worker.poll() is None, (tmp_path / "worker" / "worker.log").read_text()[-3000:]
        worker_log = (tmp_path / "worker" / "worker.log").read_text()
        assert child[0]["id"] in worker_log  # the isolated worker ran the round, not another
        logs = api(stack, "POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [child[0]["id"]]}}, "limit": 200})
        if hidden:  # the worker could not read the inputs, so it fetched them; and the pipeline fetched the round's
            # weights from MLflow into its own run directory
            assert [log for log in logs if log["message"].startswith("fetched runs:/")], [m["message"] for m in logs]
            assert list((Path(stack.state_dir) / "runs" / "fetched").glob("*/model.safetensors"))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a worker busy shutting down on a loaded machine
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
