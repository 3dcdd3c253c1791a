"""Small helpers shared by the stages: artifact references, content fingerprints, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

logger = logging.getLogger("grpo_pipeline")


class Ref(BaseModel):
    """A heavy artifact (dataset, checkpoint) passed between stages as a path plus a content fingerprint.

    Prefect hashes task inputs for cache keys, so a Ref keys on *content* rather than on a Python object.
    """

    model_config = ConfigDict(frozen=True)

    path: str
    fingerprint: str
    # A copy in the MLflow artifact store, for machines that do not share this one's disk (see `tasks.publish`).
    uri: str | None = None

    def require(self) -> Path:
        """The path, after checking that the artifact is still on disk."""
        p = Path(self.path)
        if not p.exists():
            raise FileNotFoundError(
                f"{p} is missing (a cached stage produced it and it was deleted since); rerun with --refresh"
            )
        return p


class DatasetRefs(BaseModel):
    """The prepared splits (prepare_data's Parquet files), which every later stage reads."""

    train: Ref
    eval: Ref
    # The GRPO probe's rows (data.num_probe), held out from training and disjoint from the eval items; None: none.
    probe: Ref | None = None
    # SFT's rows where they are more than the training split's (a drill added, data.synthetic.units_drill); None:
    # SFT trains on `train`.
    sft: Ref | None = None

    @property
    def sft_train(self) -> Ref:
        """The rows SFT trains on."""
        return self.sft or self.train


def fingerprint_path(path: str | Path) -> str:
    """sha256 over the relative names and bytes of every file under `path` (or of one file)."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def staging_path(final: str | Path, tag: str) -> Path:
    """The temporary directory `atomic_dir(final, tag)` writes into (hidden, beside `final`)."""
    final = Path(final)
    return final.parent / f".{final.name}.tmp-{tag}"


@contextlib.contextmanager
def atomic_dir(final: str | Path, tag: str | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside `final` and move it into place only if the block succeeds.

    A crash or a bad input therefore never leaves a half-written checkpoint where a later stage would read it.

    Another run may be reading `final` (two runs sharing a run directory build the same keyed dataset or base
    model): an existing `final` is renamed away, not deleted in place, so files it has open stay readable and the
    name is missing only between two renames. When another writer puts its own `final` in place in between, theirs
    is kept (the same key, so the same content).

    `tag` names the temporary directory (`staging_path`), for other processes that write into it too (the
    processes of one multi-process launch); a random one by default.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tag = tag or uuid.uuid4().hex[:8]
    tmp, old = staging_path(final, tag), final.parent / f".{final.name}.old-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):  # another writer moved it first
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    finally:
        for leftover in (tmp, old):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)


class Checkpoint(Ref):
    """A model directory, the MLflow run that produced it (None for a base model) and the model it started from.

    A hub model has no directory here: its `path` is its name and its fingerprint `hub:<name>`.
    """

    run_id: str | None = None
    parent: str = ""
    stage: str = "base"
    # Set when training continued from a periodic checkpoint of an interrupted attempt (tasks/training/checkpoints.py).
    resumed_from_step: int | None = None
    # Training-health alarms a GRPO round raised (tasks/training/health.py), one line each; empty for a healthy round.
    alarms: tuple[str, ...] = ()
    # What a GRPO round says that is no alarm: saturation, which step it kept and why; one line each.
    notes: tuple[str, ...] = ()
    # How a trained policy was trained: its weights', optimizer state's and autocast's dtypes, e.g. "float32 weights
    # and optimizer state, bf16 autocast" (tasks/training/trainer.py); empty for a base model.
    precision: str = ""
    # What generated a GRPO round's rollouts, e.g. "vLLM colocated" or "transformers generate"
    # (tasks/training/vllm_rollouts.py); empty for a model no GRPO round trained.
    rollouts: str = ""
    # A GRPO round that returned its start unchanged (grpo.keep_over_start found no step that beats it): the flow
    # registers nothing for it and starts no further round.
    kept_start: bool = False
    # The held-out probe's greedy accuracy of what a GRPO round returned (None without a probe); 1.0 is saturation.
    probe_accuracy: float | None = None

    @property
    def on_hub(self) -> bool:
        return self.fingerprint.startswith("hub:")

    @property
    def lineage(self) -> str:
        """How to name this model as a parent: a base model by its name (tiny, hub name, models:/...), else its path."""
        return self.parent if self.stage == "base" else self.path


def damaged(value: object) -> list[str]:
    """What is wrong with what a stage result points to: every Ref (a hub model aside) whose file or directory is
    missing or whose content no longer has its fingerprint, every other file a result lists in `local_files()`, and
    what a result's own `remote_problems()` finds off this disk (a registered version gone from its tracking store).
    Empty when all is intact. Used before a cached result is trusted."""
    problems: list[str] = []
    if isinstance(value, Ref) and not (isinstance(value, Checkpoint) and value.on_hub):
        path = Path(value.path)
        if not path.exists():
            problems.append(f"{path} is missing")
        elif (now := fingerprint_path(path)) != value.fingerprint:
            problems.append(f"{path} has changed (fingerprint {now[:12]}, expected {value.fingerprint[:12]})")
    if isinstance(value, BaseModel):
        listed = value.local_files() if callable(getattr(value, "local_files", None)) else []
        problems += [f"{p} is missing" for p in listed if not Path(p).exists()]
        if callable(check := getattr(value, "remote_problems", None)):
            problems += check()
        for name in type(value).model_fields:
            problems += damaged(getattr(value, name))
    elif isinstance(value, list | tuple):
        for item in value:
            problems += damaged(item)
    return problems


def load_tokenizer(path: str):
    """The tokenizer of the checkpoint at `path`, with EOS as its pad token when it has none (as TRL pads). Shared
    by training and evaluation, which must tokenize alike, and kept here so that an evaluation does not depend on
    the trainer's code (the evaluate stage's key covers the modules it imports)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
