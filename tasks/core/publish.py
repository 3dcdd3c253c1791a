"""Files across machines: publish a checkpoint or a data file to the MLflow artifact store, fetch it back by URI.

A GRPO round that runs on another work pool (`grpo.work_pool`) may sit on a machine without this one's disk. Before
sending the round, the pipeline publishes what the round reads (the start checkpoint to the run that trained it,
the training data and held-out rows to a run of their own); the worker fetches whatever is not on its disk, and the
round publishes its own checkpoint to its run for the pipeline and the evaluator to fetch in turn. The tracking
server proxies artifacts (`mlflow server --serve-artifacts`), so only MLflow's URL has to be reachable. The
content fingerprint is checked after every fetch.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from grpo_pipeline.tasks.core.common import Checkpoint, Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import configure_mlflow, mlflow_run, use_store

ARTIFACT_PATH = "checkpoint"
R = TypeVar("R", bound=Ref)
V = TypeVar("V")


def publish(ref: R, run_dir: str, experiment: str, run_id: str | None = None) -> R:
    """Log `ref`'s directory or file to an MLflow run (a checkpoint's own run, else `run_id`); returns it with
    `uri` set."""
    import mlflow

    own_run = isinstance(ref, Checkpoint) and ref.run_id is not None
    target = ref.run_id if own_run else run_id
    if target is None:
        raise ValueError(f"{ref.path} has no MLflow run to publish it to")
    configure_mlflow(run_dir, experiment)
    client = mlflow.MlflowClient()
    local = ref.require()
    folder = ARTIFACT_PATH if own_run else f"inputs/{ref.fingerprint[:12]}"
    if local.is_dir():
        client.log_artifacts(target, str(local), folder)
        uri = f"runs:/{target}/{folder}"
    else:
        client.log_artifact(target, str(local), folder)
        uri = f"runs:/{target}/{folder}/{local.name}"
    logger.info("published %s to %s", ref.path, uri)
    return ref.model_copy(update={"uri": uri})


def share_inputs(
    start: Checkpoint, refs: list[Ref | None], ctx: RunContext, label: str
) -> tuple[Checkpoint, list[Ref | None]]:
    """`start` and `refs` with a `uri` each (published now where they have none), for a worker on another machine
    (`share_refs`)."""
    new_start, *rest = share_refs([start, *refs], ctx, label)
    return new_start, rest  # type: ignore[return-value]


def share_refs(refs: list[Ref | None], ctx: RunContext, label: str) -> list[Ref | None]:
    """`refs` with a `uri` each (published now where they have none), for workers on other machines.

    A checkpoint goes to the run that trained it; data files (and a base model, which has no run) to one run
    named `<recipe>-<label>-inputs`, created only when something needs it. A hub model needs nothing.
    """
    pending = [r for r in refs if r is not None and r.uri is None and not _on_hub(r)]
    if not pending:
        return refs
    orphans = [r for r in pending if not (isinstance(r, Checkpoint) and r.run_id is not None)]
    shared: dict[int, Ref] = {}
    if orphans:
        with mlflow_run(ctx.run_dir, ctx.experiment, f"{ctx.recipe}-{label}-inputs", {"stage": "inputs"}) as run:
            inputs_run = run.info.run_id
        for r in orphans:
            shared[id(r)] = publish(r, ctx.run_dir, ctx.experiment, inputs_run)
    for r in pending:
        if id(r) not in shared:
            shared[id(r)] = publish(r, ctx.run_dir, ctx.experiment)
    return [shared.get(id(r), r) if r is not None else None for r in refs]


def refs_in(value: Any) -> list[Ref]:
    """Every Ref in `value` (a stage's arguments: Refs, and pydantic models holding them, such as a GRPO round's
    spec), depth first."""
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, BaseModel):
        return [r for name in type(value).model_fields for r in refs_in(getattr(value, name))]
    if isinstance(value, dict):
        return [r for v in value.values() for r in refs_in(v)]
    return []


def replace_refs(value: V, new: Callable[[Ref], Ref]) -> V:
    """`value` with every Ref in it (as `refs_in` finds them) replaced by `new(ref)`."""
    if isinstance(value, Ref):
        return new(value)  # type: ignore[return-value]
    if isinstance(value, BaseModel):
        replaced = {name: replace_refs(getattr(value, name), new) for name in type(value).model_fields}
        changed = {k: v for k, v in replaced.items() if v is not getattr(value, k)}
        return value.model_copy(update=changed) if changed else value  # a model without Refs stays the same object
    if isinstance(value, dict):
        items = {k: replace_refs(v, new) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items  # type: ignore[return-value]
    return value


def _on_hub(ref: Ref) -> bool:
    return isinstance(ref, Checkpoint) and ref.on_hub


def materialize(ref: R, run_dir: str) -> R:
    """`ref` with a local path: itself when its file or directory is here (or it is a hub model), else a verified
    download of its `uri` into `<run_dir>/fetched/<fingerprint>`."""
    import mlflow

    if Path(ref.path).exists() or _on_hub(ref):
        return ref
    if ref.uri is None:
        raise FileNotFoundError(f"{ref.path} is not on this machine and was not published to MLflow")
    use_store(run_dir)
    out = Path(run_dir).resolve() / "fetched" / ref.fingerprint[:12]
    is_file = ref.uri.rsplit("/", 1)[-1] == Path(ref.path).name  # `publish` names files in their URI, not folders
    local = out / Path(ref.path).name if is_file else out
    if not (local.exists() and fingerprint_path(local) == ref.fingerprint):
        with atomic_dir(out) as tmp:
            downloaded = Path(mlflow.artifacts.download_artifacts(artifact_uri=ref.uri, dst_path=str(tmp / "dl")))
            items = [downloaded] if downloaded.is_file() else list(downloaded.iterdir())
            for item in items:
                shutil.move(str(item), tmp / item.name)
            shutil.rmtree(tmp / "dl", ignore_errors=True)
            got = fingerprint_path(tmp / local.name if is_file else tmp)
            if got != ref.fingerprint:
                raise ValueError(f"{ref.uri} has fingerprint {got[:12]}, expected {ref.fingerprint[:12]}")
        logger.info("fetched %s into %s", ref.uri, local)
    return ref.model_copy(update={"path": str(local)})


# ----------------------------------------------------------------------------- a remote round's result

HANDOFF_TAG = "grpo_pipeline.handoff"
HANDOFF_FILE = "handoff/checkpoint.json"


def hand_over(policy: Checkpoint, handoff: str, run_dir: str) -> None:
    """Leave a published checkpoint (its `uri` set) for the flow that sent the round: its JSON in the policy's own
    MLflow run, tagged `handoff`, so that the result travels through the tracking server both sides already use,
    never through Prefect's result storage (which would have to be shared between the machines)."""
    import mlflow

    use_store(run_dir)
    client = mlflow.MlflowClient()
    client.log_text(policy.run_id, policy.model_dump_json(), HANDOFF_FILE)
    client.set_tag(policy.run_id, HANDOFF_TAG, handoff)  # last: a tagged run has its checkpoint


def take_over(handoff: str, run_dir: str, experiment: str) -> Checkpoint:
    """The checkpoint `hand_over` left under `handoff` (in `experiment`), fetched here where its path is not."""
    import mlflow

    experiment_id = configure_mlflow(run_dir, experiment)
    client = mlflow.MlflowClient()
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{HANDOFF_TAG}` = '{handoff}'", max_results=2)
    if len(runs) != 1:
        raise RuntimeError(
            f"the GRPO round's worker finished but {len(runs)} MLflow runs of experiment {experiment!r} carry its "
            f"result (tag {HANDOFF_TAG}={handoff}); is the worker on the same MLflow tracking server?"
        )
    text = mlflow.artifacts.load_text(f"runs:/{runs[0].info.run_id}/{HANDOFF_FILE}")
    return materialize(Checkpoint.model_validate_json(text), run_dir)
