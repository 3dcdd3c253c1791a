"""Resumable checkpoints for workers that share no disk: each sealed checkpoint is mirrored to the stage's MLflow run.

Under `accelerate launch` every process writes into one resume folder on one disk (tasks/training/checkpoints.py).
A Ray Train job (tasks/core/ray_launch.py) may place its workers on machines that share nothing but the MLflow
tracking server, and a rerun may place rank 0 on another machine than the attempt that was killed. So there:
  - at each save, every worker sends process 0 the files only it wrote (the Trainer's `rng_state_<rank>.pth`, its
    part of a GRPO round's start: checkpoints.process_files) where process 0's disk lacks them, process 0 seals the
    whole checkpoint, logs it to its MLflow run under `resume/checkpoint-<step>/` and only then tags the run with the
    step (`RESUME_STEP_TAG`): a tagged step is complete in the store (the tag and the copies go once the stage's
    output is saved: `forget_mirrored`);
  - before training, process 0 looks up the newest tagged run of the stage (`RESUME_KEY_TAG`, the stage's output
    folder, so the same config and inputs) and broadcasts its choice; every worker fetches that checkpoint into its
    own resume folder unless an intact copy is there, and the Trainer resumes from it as it would from a local one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.tasks.core.common import atomic_dir, logger
from grpo_pipeline.tasks.core.ray_launch import MIRROR_ENV
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import configure_mlflow
from grpo_pipeline.tasks.training.checkpoints import problem, process_files, seal_on_save
from grpo_pipeline.tasks.training.consensus import agree, gather, rank

if TYPE_CHECKING:  # transformers loads when a stage trains, not when the flow is imported
    from transformers import TrainerCallback

RESUME_KEY_TAG = "grpo_pipeline.resume_key"
RESUME_STEP_TAG = "grpo_pipeline.resume_step"
FOLDER = "resume"


def mirrored() -> bool:
    """True in a process whose checkpoints must travel through MLflow (a Ray Train worker)."""
    return os.environ.get(MIRROR_ENV) == "1"


def resume_key(out: Path) -> str:
    """What names a stage's attempts in MLflow: its output folder and key (`grpo-round1/3f2a...`)."""
    return f"{out.parent.name}/{out.name}"


def newest_mirrored(ctx: RunContext, key: str) -> tuple[str, int] | None:
    """The newest MLflow run of the stage `key` that holds a complete checkpoint, and that checkpoint's step."""
    import mlflow

    experiment_id = configure_mlflow(ctx.run_dir, ctx.experiment)
    runs = mlflow.MlflowClient().search_runs(
        [experiment_id],
        filter_string=f"tags.`{RESUME_KEY_TAG}` = '{key}'",
        order_by=["attributes.start_time DESC"],
    )
    for run in runs:
        if (step := run.data.tags.get(RESUME_STEP_TAG)) is not None:
            return run.info.run_id, int(step)
    return None


def restore_mirrored(resume: Path, stage: str, ctx: RunContext, key: str) -> tuple[Path | None, int | None, str | None]:
    """The newest mirrored checkpoint of `key`, as process 0 chose it, fetched into this worker's `resume` folder:
    its local path, its step and the MLflow run to continue, or (None, None, None) when there is none. Every worker
    resumes from that one checkpoint, never from a newer one its own disk may hold (its upload did not finish)."""
    chosen = agree(newest_mirrored(ctx, key) if rank() == 0 else None)
    run_id, step = chosen if chosen is not None else (None, None)
    target = resume / f"checkpoint-{step}" if step is not None else None
    # One worker per machine goes first (LOCAL_RANK 0): it drops local checkpoints other than the chosen one and
    # fetches that; then the others find its copy. Workers that share a disk thus fetch once and never replace a folder
    # another worker is reading.
    first = int(os.environ.get("LOCAL_RANK", "0")) == 0
    for turn in (True, False):
        if first == turn:
            if turn:
                for other in (p for p in resume.glob("checkpoint-*") if p != target):
                    shutil.rmtree(other, ignore_errors=True)
            if target is not None and problem(target) is not None:
                fetch_checkpoint(run_id, target, ctx)
        gather(None)  # everyone waits for this turn
    if target is not None:
        logger.info("%s: resuming from step %d, mirrored in MLflow run %s", stage, step, run_id)
    return target, step, run_id


def fetch_checkpoint(run_id: str, target: Path, ctx: RunContext) -> None:
    """Download `resume/<target name>` of MLflow run `run_id` into `target`, whole or not at all, checked against
    its seal."""
    import mlflow

    configure_mlflow(ctx.run_dir, ctx.experiment)
    with atomic_dir(target) as tmp:
        got = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=f"{FOLDER}/{target.name}", dst_path=str(tmp / "dl")
        )
        for item in Path(got).iterdir():
            item.rename(tmp / item.name)
        shutil.rmtree(tmp / "dl")
        if (why := problem(tmp)) is not None:
            raise RuntimeError(f"checkpoint {target.name} of MLflow run {run_id} does not match its seal: {why}")
    logger.info("fetched %s of MLflow run %s into %s", target.name, run_id, target)


def mirror_on_save(args: Any, state: Any, run_id: str | None) -> None:
    """Every worker: hand process 0 the files only it wrote; process 0: seal the checkpoint, log it, tag the step."""
    import mlflow

    path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
    own = gather([str(p.relative_to(path)) for p in process_files(path, args.process_index) if p.is_file()])
    # only what process 0 lacks (written on another machine's disk) travels: on a shared disk no bytes do
    zero = state.is_world_process_zero
    lacking = agree([[name for name in names if not (path / name).is_file()] for names in own] if zero else None)
    shares = gather([(name, (path / name).read_bytes()) for name in lacking[args.process_index]])
    if not state.is_world_process_zero:
        return
    for name, data in (share for process in shares for share in process):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)  # process 0 keeps a copy
    seal_on_save(args, state)
    client = mlflow.MlflowClient()
    client.log_artifacts(run_id, str(path), f"{FOLDER}/{path.name}")
    client.set_tag(run_id, RESUME_STEP_TAG, str(state.global_step))  # last: a tagged step is all in the store
    prune_mirrored(client, run_id, keep=args.save_total_limit)


def prune_mirrored(client: Any, run_id: str, keep: int | None) -> None:
    """Keep the newest `keep` mirrored checkpoints of `run_id` (the Trainer's save_total_limit, as on the local disk);
    a store that cannot delete keeps them all (they are never read again)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    mirrored_steps = sorted(
        int(step)
        for info in client.list_artifacts(run_id, FOLDER)
        if (step := info.path.rsplit("checkpoint-", 1)[-1]).isdigit()
    )
    stale = mirrored_steps[:-keep] if keep else []
    try:
        repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri)
        for step in stale:
            repo.delete_artifacts(f"{FOLDER}/checkpoint-{step}")
    except Exception as e:
        logger.info("older mirrored checkpoints of MLflow run %s stay in its artifacts (%s)", run_id, e)


def mirror_callback(run_id: str | None) -> TrainerCallback:
    """A Trainer callback that seals each checkpoint and mirrors it to MLflow run `run_id` (process 0's run)."""
    from transformers import TrainerCallback

    class MirrorCheckpoints(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            mirror_on_save(args, state, run_id)

    return MirrorCheckpoints()


def forget_mirrored(run_id: str) -> None:
    """Once the stage's output is saved: its run no longer offers a checkpoint to resume from (a later run of the same
    key trains afresh, as it does where the local resume folder is removed), and the mirrored copies go where the
    artifact store can delete (local folders, the tracking server's proxy)."""
    import mlflow
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    client = mlflow.MlflowClient()
    client.delete_tag(run_id, RESUME_STEP_TAG)
    try:
        get_artifact_repository(client.get_run(run_id).info.artifact_uri).delete_artifacts(FOLDER)
    except Exception as e:  # a store that cannot delete keeps them; they are never read again
        logger.info("the mirrored checkpoints of MLflow run %s stay in its artifacts (%s)", run_id, e)
