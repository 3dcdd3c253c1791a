"""`distributed.backend: ray` without a cluster: the config's refusals, the run context, how a stage's inputs are found
and replaced for workers elsewhere, and checkpoints mirrored to MLflow and fetched back (tasks/training/
checkpoint_mirror.py) in one process. The cluster itself is tested in tests/test_ray.py (`make test-ray`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.publish import refs_in, replace_refs
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.grpo import GRPORound
from grpo_pipeline.tasks.training import checkpoint_mirror
from grpo_pipeline.tasks.training.checkpoints import SEAL, START_DIR, problem, process_files, start_weights_name
from tests.decisions import in_two_processes


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["distributed.num_workers=2"], r"does not use distributed\.num_workers: set distributed\.backend=ray"),
        (
            ["distributed.ray_address=ray://head:10001"],
            r"does not use distributed\.ray_address: set distributed\.backend=ray",
        ),
        (["distributed.backend=ray", "distributed.num_processes=2"], r"set distributed\.num_workers=2 instead"),
        (
            ["distributed.backend=ray", "distributed.accelerate_config=configs/accelerate/zero2.yaml"],
            r"unset distributed\.accelerate_config",
        ),
        (["distributed.backend=ray", "distributed.resources_per_worker={gpu: 1}"], r"rename gpu -> GPU"),
        (["distributed.backend=ray", "distributed.resources_per_worker={}"], r"must reserve something"),
        (["distributed.backend=ray", "distributed.resources_per_worker={CPU: -1}"], r"no negative amount"),
        (
            ["distributed.backend=ray", "distributed.num_workers=3", "grpo.prompts_per_step=8"],
            r"split evenly across distributed\.num_workers \(3\)",
        ),
    ],
)
def test_bad_combinations_are_refused_naming_what_to_change(overrides: list[str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        load_config(None, overrides)


def test_the_run_context_counts_ray_workers_as_its_processes() -> None:
    cfg = load_config(
        None,
        ["distributed.backend=ray", "distributed.num_workers=4", "distributed.resources_per_worker={GPU: 1, CPU: 2}"],
    )
    ctx = RunContext.of(cfg)
    assert (ctx.backend, ctx.num_processes, ctx.resources_per_worker) == ("ray", 4, {"GPU": 1.0, "CPU": 2.0})
    assert RunContext.of(load_config(None, [])).backend == "accelerate"


def test_a_rounds_inputs_are_found_and_replaced_where_they_sit() -> None:
    cfg = load_config(None, [])
    start, train = Checkpoint(path="sft", fingerprint="a"), Ref(path="train.parquet", fingerprint="b")
    spec = GRPORound(start=start, train=train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=RunContext.of(cfg))
    params = {"spec": spec, "note": "untouched"}
    assert refs_in(params) == [start, train]  # held_out is None: nothing to publish
    moved = replace_refs(params, lambda ref: ref.model_copy(update={"path": f"/fetched/{ref.path}"}))
    assert (moved["spec"].start.path, moved["spec"].train.path) == ("/fetched/sft", "/fetched/train.parquet")
    assert isinstance(moved["spec"].start, Checkpoint) and moved["note"] == "untouched"
    assert moved["spec"].cfg is spec.cfg  # what holds no Ref is passed on as it is


def fake_checkpoint(folder: Path, step: int) -> Path:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights %d" % step)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_checkpoints_mirrored_to_mlflow_come_back_on_a_disk_without_them(tmp_path: Path) -> None:
    """A worker saves two checkpoints (mirrored), the disk is lost; a new attempt on an empty disk fetches the newest
    one, sealed and intact, with the run to continue; once the stage is done, no attempt resumes from it."""
    import mlflow

    from grpo_pipeline.tasks.core.tracking import mlflow_run

    ctx = RunContext(run_dir=str(tmp_path / "runs"), experiment="mirror", recipe="r", seed=0)
    key = "grpo-round1/0123456789ab"
    with mlflow_run(ctx.run_dir, ctx.experiment, "r-grpo", {checkpoint_mirror.RESUME_KEY_TAG: key}) as run:
        run_id = run.info.run_id
    first_disk = tmp_path / "node-a" / "out.resume"
    for step in (2, 4):
        fake_checkpoint(first_disk, step)
        args = SimpleNamespace(output_dir=str(first_disk), process_index=0, save_total_limit=1)
        checkpoint_mirror.mirror_on_save(args, SimpleNamespace(global_step=step, is_world_process_zero=True), run_id)
    assert (first_disk / "checkpoint-4" / SEAL).is_file()  # sealed before it was mirrored
    client = mlflow.MlflowClient()
    assert [a.path for a in client.list_artifacts(run_id, "resume")] == ["resume/checkpoint-4"]  # save_total_limit

    other_disk = tmp_path / "node-b" / "out.resume"
    (other_disk / "checkpoint-6").mkdir(parents=True)  # newer, but never mirrored: not to be resumed from
    last, step, resumed_run = checkpoint_mirror.restore_mirrored(other_disk, "grpo-round1", ctx, key)
    assert (last, step, resumed_run) == (other_disk / "checkpoint-4", 4, run_id)
    assert (last / "model.safetensors").read_bytes() == b"weights 4"
    assert not (other_disk / "checkpoint-6").exists()

    checkpoint_mirror.forget_mirrored(run_id)
    assert checkpoint_mirror.newest_mirrored(ctx, key) is None


def mirror_from_two_disks(ctx: RunContext, run_id: str, base: str, rank: int) -> list[str]:
    """Process `rank` of a two-worker job on a disk of its own (`<base>/node-<rank>`): it writes what the Trainer and
    the probe write there for checkpoint 2 (its RNG state and its part of the round's start; process 0 the model and
    the start's results), then mirrors it. Returns the files process 0's checkpoint holds afterwards."""
    from grpo_pipeline.tasks.core.tracking import configure_mlflow

    path = Path(base, f"node-{rank}", "out.resume", "checkpoint-2")
    for name in process_files(path, rank):
        name.parent.mkdir(parents=True, exist_ok=True)
        name.write_bytes(b"process %d" % rank)
    if rank == 0:
        (path / "model.safetensors").write_bytes(b"weights 2")
        (path / START_DIR / "start.json").write_text(json.dumps({"step": 0, "items": [1.0]}))
        configure_mlflow(ctx.run_dir, ctx.experiment)
    args = SimpleNamespace(output_dir=str(path.parent), process_index=rank, save_total_limit=2)
    state = SimpleNamespace(global_step=2, is_world_process_zero=rank == 0)
    checkpoint_mirror.mirror_on_save(args, state, run_id if rank == 0 else None)
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_a_checkpoint_mirrored_from_workers_on_two_disks_holds_every_workers_part_of_the_start(tmp_path: Path) -> None:
    """Under Ray a worker's files (its RNG state, its part of a GRPO round's start) are on its own disk only; process
    0 gathers them before it seals and mirrors the checkpoint, so a rerun on any machine finds the whole start."""
    from grpo_pipeline.tasks.core.tracking import mlflow_run

    ctx = RunContext(run_dir=str(tmp_path / "runs"), experiment="mirror", recipe="r", seed=0)
    key = "grpo-round1/0123456789ab"
    with mlflow_run(ctx.run_dir, ctx.experiment, "r-grpo", {checkpoint_mirror.RESUME_KEY_TAG: key}) as run:
        run_id = run.info.run_id
    scenario = functools.partial(mirror_from_two_disks, ctx, run_id, str(tmp_path))
    (tmp_path / "results").mkdir()
    on_zero, _ = in_two_processes(scenario, tmp_path / "results")
    start = [f"{START_DIR}/{name}" for name in ("start.json", start_weights_name(0), start_weights_name(1))]
    assert {*start, "rng_state_0.pth", "rng_state_1.pth", SEAL} <= set(on_zero)

    elsewhere = tmp_path / "node-2" / "out.resume"
    last, step, _ = checkpoint_mirror.restore_mirrored(elsewhere, "grpo-round1", ctx, key)
    assert step == 2 and problem(last) is None
    assert (last / START_DIR / start_weights_name(1)).read_bytes() == b"process 1"


def test_backend_ray_without_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from grpo_pipeline.tasks.core.ray_launch import ray_launch

    monkeypatch.setitem(sys.modules, "ray.train", None)  # as where the ray extra is not installed
    ctx = RunContext(run_dir=str(tmp_path), experiment="e", recipe="r", seed=0, backend="ray", num_processes=2)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'.*distributed\.backend=accelerate"):
        ray_launch(lambda **kw: None, {"out": tmp_path / "out"}, ctx)  # type: ignore[arg-type]
