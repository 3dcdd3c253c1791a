"""`@on_cluster` (tasks/core/ray_tasks.py) without a cluster: which runs stay on this machine, and what a Ray task
would reserve. tests/test_ray.py runs evaluations as Ray tasks on a real cluster (make test-ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_pipeline.tasks.core import ray_cluster, ray_tasks
from grpo_pipeline.tasks.core.stage import RunContext

CTX = RunContext(run_dir="runs", experiment="e", recipe="r", seed=0)


def stage_calls() -> tuple[Any, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    @ray_tasks.on_cluster(localize=lambda result, params: f"{result} (localized)")
    def fn(ctx: RunContext, out: Path) -> str:
        calls.append({"ctx": ctx, "out": out})
        return "ran here"

    return fn, calls


def test_the_accelerate_backend_runs_the_stage_in_this_process(tmp_path: Path) -> None:
    fn, calls = stage_calls()
    assert fn(ctx=CTX, out=tmp_path) == "ran here"  # not localized: nothing was sent anywhere
    assert calls == [{"ctx": CTX, "out": tmp_path}]


def test_inside_a_ray_task_the_stage_runs_there(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fn, calls = stage_calls()
    monkeypatch.setenv(ray_tasks.IN_TASK_ENV, "1")
    assert fn(ctx=CTX.model_copy(update={"backend": "ray"}), out=tmp_path) == "ran here"
    assert len(calls) == 1


def test_with_the_ray_backend_the_stage_is_sent_and_its_result_localized(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fn, calls = stage_calls()
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(ray_tasks, "ray_task", lambda f, params, ctx: sent.append(params) or "ran on the cluster")
    ctx = CTX.model_copy(update={"backend": "ray"})
    assert fn(ctx=ctx, out=tmp_path) == "ran on the cluster (localized)"
    assert calls == [] and sent == [{"ctx": ctx, "out": tmp_path}]


def test_a_task_reserves_one_workers_resources() -> None:
    options = {"num_cpus": 2.0, "num_gpus": 1.0, "resources": {"accelerator_type:H100": 0.5}}
    assert ray_tasks._resources(options) == "2 CPU, 1 GPU, 0.5 accelerator_type:H100"


def test_an_input_is_published_once_per_mlflow_store_and_the_run_dir_sent_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from grpo_pipeline.tasks.core.common import Ref

    published: list[str] = []

    def share(refs: list[Ref], ctx: RunContext, label: str) -> list[Ref]:
        published.extend(f"{ctx.run_dir}:{r.path}" for r in refs)
        return [r.model_copy(update={"uri": f"runs:/{ctx.run_dir}/{r.fingerprint}"}) for r in refs]

    monkeypatch.setattr(ray_cluster, "share_refs", share)
    monkeypatch.setattr(ray_cluster, "_published", {})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = Ref(path=str(tmp_path / "eval.jsonl"), fingerprint="f" * 64)
    here, there = (CTX.model_copy(update={"run_dir": str(tmp_path / d)}) for d in ("a", "b"))
    first = ray_cluster.shared_inputs({"held_out": rows, "ctx": here}, here, "eval-sft")
    again = ray_cluster.shared_inputs({"held_out": rows, "ctx": here}, here, "eval-sft-one_digit")
    other = ray_cluster.shared_inputs({"held_out": rows, "ctx": there}, there, "eval-sft")
    assert first["held_out"].uri == again["held_out"].uri == f"runs:/{here.run_dir}/{'f' * 64}"
    assert other["held_out"].uri == f"runs:/{there.run_dir}/{'f' * 64}"  # another store's copy, not this one's
    assert published == [f"{here.run_dir}:{rows.path}", f"{there.run_dir}:{rows.path}"]
    # a node that lacks an input fetches it under the run's folder, not under its own working directory
    monkeypatch.chdir(tmp_path)
    relative = CTX.model_copy(update={"run_dir": "a"})
    sent = ray_cluster.shared_inputs({"held_out": rows, "ctx": relative}, relative, "eval-sft")
    assert sent["ctx"].run_dir == str(tmp_path / "a")
    assert sent["held_out"].uri == first["held_out"].uri  # the same store (runs under tmp_path/a): not published again
