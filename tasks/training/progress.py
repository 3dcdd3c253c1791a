"""Training progress as a Prefect progress artifact (steps done of total), visible in the run's Artifacts tab.

Only inside a Prefect run: called as plain functions (tests, a REPL), the stages report nothing here. Updates are
throttled (every 2% of the steps, at most one every few seconds) so a long run does not flood the API.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from transformers import TrainerCallback

from grpo_pipeline.tasks.core.common import logger

MIN_INTERVAL_S = 5.0


def in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() is not None or FlowRunContext.get() is not None


class PrefectProgress(TrainerCallback):
    """Keep the progress artifact `<stage>-progress` at global_step / max_steps."""

    def __init__(self, stage: str) -> None:
        self.key = f"{stage}-progress".lower().replace("_", "-")
        self.stage = stage
        self.artifact: UUID | None = None
        self.last_percent, self.last_time = -1.0, 0.0

    def _report(self, done: int, total: int, final: bool = False) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        percent = 100.0 * done / max(total, 1)
        now = time.monotonic()
        if not final and (percent - self.last_percent < 2.0 or now - self.last_time < MIN_INTERVAL_S):
            return
        description = f"{self.stage}: step {done} of {total}"
        try:
            if self.artifact is None:
                self.artifact = create_progress_artifact(percent, key=self.key, description=description)
            else:
                update_progress_artifact(self.artifact, percent, description=description)
        except Exception as e:  # progress is a convenience: never fail training over it
            logger.debug("progress artifact not updated: %s", e)
        self.last_percent, self.last_time = percent, now

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if in_prefect_run():
            self._report(state.global_step, state.max_steps, final=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.artifact is not None:
            self._report(state.global_step, state.max_steps, final=state.global_step == state.max_steps)
