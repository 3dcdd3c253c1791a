"""Resumable training: periodic checkpoints that are sealed when complete, and the newest sealed one to resume from.

The Trainer writes `checkpoint-<step>/` (model, optimizer, scheduler, RNG states, trainer_state.json) every
`save_every_steps` optimizer steps into a stage's resume folder, `<stage output>.resume/` beside the output the
stage will produce. Its writes are not atomic: a process killed in the middle of one leaves a folder that looks
like a checkpoint. So once the Trainer reports a save (`on_save`), `seal_callback()` writes `sealed.json` with the
size and sha256 of every file in it; a checkpoint counts only when its seal is present and every file still matches.
A rerun of the same stage key (the same config and inputs), or a Prefect retry of the task, resumes from the newest
sealed checkpoint and deletes the unsealed ones; the folder is removed once the stage's output is saved.

A GRPO round that keeps its best-probed step (grpo.keep: best_probe) also stores its start in every checkpoint
(`START_DIR`, tasks/training/probe.py): a checkpoint then holds all a resumed attempt needs, on whichever disk it is
restored to, and its seal covers the start too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.tasks.core.common import logger

if TYPE_CHECKING:  # transformers loads when a stage trains, not when the flow is imported
    from transformers import TrainerCallback

SEAL = "sealed.json"
RUN_ID_FILE = "mlflow_run_id"
START_DIR = "probe-start"  # in a checkpoint (and beside them, from the round's first step): the round's start
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def resume_dir(out: Path) -> Path:
    """Where the stage that writes `out` keeps its periodic checkpoints until `out` exists."""
    return out.parent / f"{out.name}.resume"


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != SEAL)


def seal(checkpoint: Path) -> None:
    """Record every file of a complete checkpoint (written last, atomically, so a seal is never half-written)."""
    files = {
        str(p.relative_to(checkpoint)): {"bytes": p.stat().st_size, "sha256": _file_digest(p)}
        for p in _files(checkpoint)
    }
    tmp = checkpoint / f".{SEAL}.tmp"
    tmp.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    os.replace(tmp, checkpoint / SEAL)


def problem(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be resumed from (unsealed: its save did not finish; a file gone or changed), or None."""
    try:
        recorded = json.loads((checkpoint / SEAL).read_text())["files"]
    except FileNotFoundError:
        return "not sealed (its save did not finish)"
    except (ValueError, KeyError) as e:
        return f"unreadable seal ({e})"
    present = {str(p.relative_to(checkpoint)) for p in _files(checkpoint)}
    if missing := sorted(set(recorded) - present):
        return f"missing {', '.join(missing)}"
    for name, expected in recorded.items():
        path = checkpoint / name
        try:
            if path.stat().st_size != expected["bytes"] or _file_digest(path) != expected["sha256"]:
                return f"{name} is corrupt (its content changed after it was saved)"
        except OSError as e:  # deleted meanwhile (another process pruning it)
            return f"{name} is unreadable ({e})"
    return None


def start_weights_name(process_index: int) -> str:
    """The file of `START_DIR` that holds process `process_index`'s part of the start's trainable weights."""
    return f"weights-rank{process_index}.pt"


def process_files(checkpoint: Path, process_index: int) -> list[Path]:
    """The files of `checkpoint` that process `process_index` alone writes (on a disk of its own, under Ray): its RNG
    state and its part of the round's start."""
    return [checkpoint / f"rng_state_{process_index}.pth", checkpoint / START_DIR / start_weights_name(process_index)]


def checkpoint_step(path: Path) -> int | None:
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else None


def latest_complete(folder: Path, stage: str, prune: bool = True) -> Path | None:
    """The newest sealed, intact checkpoint in `folder`; newer broken ones are logged and (`prune`) deleted."""
    if not folder.is_dir():
        return None
    found = sorted((p for p in folder.iterdir() if p.is_dir() and checkpoint_step(p) is not None), key=checkpoint_step)
    for path in reversed(found):
        why = problem(path)
        if why is None:
            return path
        logger.warning("%s: skipping %s: %s", stage, path, why)
        if prune:
            shutil.rmtree(path, ignore_errors=True)  # the Trainer would otherwise count it in save_total_limit
    return None


def remembered_run_id(folder: Path) -> str | None:
    """The MLflow run a resumed stage continues (written when the stage first started)."""
    path = folder / RUN_ID_FILE
    return path.read_text().strip() or None if path.is_file() else None


def remember_run_id(folder: Path, run_id: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RUN_ID_FILE}.tmp"
    tmp.write_text(run_id)
    os.replace(tmp, folder / RUN_ID_FILE)


def seal_on_save(args: Any, state: Any) -> None:
    """Seal the checkpoint the Trainer has just written in full (model, optimizer, scheduler, RNG, state)."""
    if not state.is_world_process_zero:
        return
    path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
    if path.is_dir():
        seal(path)
        logger.info("checkpoint at step %d saved: %s", state.global_step, path)


def seal_callback() -> TrainerCallback:
    """A Trainer callback that seals each checkpoint as soon as the Trainer has written all of it."""
    from transformers import TrainerCallback

    class SealCheckpoints(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seal_on_save(args, state)

    return SealCheckpoints()
