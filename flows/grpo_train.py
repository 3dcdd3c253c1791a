"""One GRPO round as its own flow, `grpo-train`, for a work pool with GPUs (deployment `grpo-train/gpu`).

The pipeline runs it through `run_deployment` when `grpo.work_pool` is set (`remote_grpo_train` below) and
continues with the checkpoint it returns. The worker may sit on a machine that shares nothing with this one but the
Prefect and MLflow servers: the round's inputs (start checkpoint, training data, held-out probe rows) are published
to MLflow before the round is sent, and the worker fetches those that are not on its disk; the round's checkpoint is
published to its MLflow run, with the checkpoint's description under a tag the pipeline chose (`hand_over`), and
the pipeline reads it from there (`take_over`), fetching the weights where the path is not local. Prefect's result
storage is not used: the worker needs none of the pipeline's.
"""

from __future__ import annotations

import uuid

from prefect import flow
from prefect.deployments import run_deployment

from grpo_pipeline.tasks.core.common import Checkpoint
from grpo_pipeline.tasks.core.publish import hand_over, materialize, publish, replace_refs, share_inputs, take_over
from grpo_pipeline.tasks.core.runtime import add_import_paths, setup
from grpo_pipeline.tasks.grpo import GRPORound, grpo_train


class RoundFailed(RuntimeError):
    """A GRPO round on another work pool whose child flow run did not complete: its final state and message."""

    def __init__(self, round_index: int, pool: str | None, state_name: str, message: str) -> None:
        super().__init__(f"GRPO round {round_index} on pool {pool!r} ended {state_name}: {message}")
        self.state_name, self.message = state_name, message


@flow(name="grpo-train", log_prints=False, persist_result=False)
def grpo_train_flow(spec: GRPORound, handoff: str | None = None) -> Checkpoint:
    """Train one GRPO round and publish the checkpoint to MLflow (its `uri`); the round's training-health alarms come
    back with the checkpoint. With `handoff` (a token the sending pipeline chose), the checkpoint is also left in
    MLflow under it, where the pipeline reads it back."""
    setup()
    add_import_paths(spec.code_dir)  # the user's reward modules, beside the recipe
    # On a machine without the pipeline's disk, fetch the inputs the pipeline published (a no-op where they are here).
    run_dir = spec.ctx.run_dir
    spec = replace_refs(spec, lambda ref: materialize(ref, run_dir))
    policy = publish(grpo_train(spec), run_dir, spec.ctx.experiment)
    if handoff is not None:
        hand_over(policy, handoff, run_dir)
    return policy


def remote_grpo_train(spec: GRPORound) -> Checkpoint:
    """`grpo_train` through the deployment `grpo-train/<spec.cfg.work_pool>`; waits for it and returns its checkpoint,
    fetched here when its path is not. A failed child fails this call with the child's error."""
    ctx, pool, r = spec.ctx, spec.cfg.work_pool, spec.round_index
    start, (train, held_out) = share_inputs(spec.start, [spec.train, spec.held_out], ctx, spec.name)
    handoff = uuid.uuid4().hex  # names the round's result in MLflow
    shared = spec.model_copy(update={"start": start, "train": train, "held_out": held_out})
    child = run_deployment(
        f"grpo-train/{pool}",
        parameters={"spec": shared.model_dump(mode="json"), "handoff": handoff},
        flow_run_name=spec.name,
        timeout=None,  # wait for the round, however long it trains
        poll_interval=2,  # one small API call each time; the round's end is seen within 2 s (Prefect's default: 5)
    )
    if not child.state or not child.state.is_completed():
        message = child.state.message if child.state else "no state"
        raise RoundFailed(r, pool, child.state_name or "without a state", message or "")
    return take_over(handoff, ctx.run_dir, ctx.experiment)
