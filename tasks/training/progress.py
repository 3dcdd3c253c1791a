"""Training progress: one line on the console per training stage, and a Prefect progress artifact.

`ConsoleProgress` replaces transformers' own progress display, whose bar prints every log dict of the trainer under
it (`{'loss': ..., 'reward': ...}`, 30-odd keys for GRPO; ProgressCallback.on_log, or PrinterCallback's print when
tqdm is off): one bar per stage whose postfix carries the stage's key numbers, the loss, and for GRPO the mean reward
and the held-out probe's greedy accuracy. The full logs still go where they went (MLflow through MLflowCallback,
the trainer state), and to the log at DEBUG (`-v`). `console_progress` puts it in place around training.

`PrefectProgress` keeps the progress artifact (steps done of total), visible in the run's Artifacts tab. Only inside a
Prefect run: called as plain functions (tests, a REPL), the stages report nothing there. Updates are throttled (every
2% of the steps, at most one every few seconds) so a long run does not flood the API.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from uuid import UUID

from transformers import TrainerCallback

from grpo_pipeline.tasks.core.common import logger

if TYPE_CHECKING:
    from transformers import Trainer

MIN_INTERVAL_S = 5.0
NON_TTY_INTERVAL_S = 10.0  # the console line's redraws, when stderr is a file or a pipe
# The numbers a stage's progress line shows, in this order, where its trainer logs them: (log key, label).
KEY_NUMBERS = (("loss", "loss"), ("reward", "reward"))


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


class ConsoleProgress(TrainerCallback):
    """One progress bar for the stage (process 0 only), its postfix the latest key numbers: `loss` (SFT and GRPO),
    `reward` (GRPO's mean reward) and `probe acc` (the held-out probe's last greedy accuracy, when it runs).
    `probe` is any object with a `history` of (step, accuracy), such as HeldOutAccuracyProbe."""

    def __init__(self, stage: str, probe: Any = None) -> None:
        self.stage = stage
        self.probe = probe
        self.bar: Any = None
        self.numbers: dict[str, float] = {}
        self.train_loss: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from tqdm.auto import tqdm

        if state.is_world_process_zero:
            self.bar = tqdm(
                total=state.max_steps, initial=state.global_step, desc=self.stage, dynamic_ncols=True,
                disable=bool(args.disable_tqdm),
                # On a terminal the line redraws in place; in a log file each redraw is more text, so fewer of them.
                mininterval=0.1 if sys.stderr.isatty() else NON_TTY_INTERVAL_S,
            )  # fmt: skip

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)
            self._show()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        logger.debug("%s step %d: %s", self.stage, state.global_step, logs)
        self.numbers |= {label: logs[key] for key, label in KEY_NUMBERS if isinstance(logs.get(key), int | float)}
        self.train_loss = logs.get("train_loss", self.train_loss)  # the trainer's last log: the run's mean loss
        self._show()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()
        if state.is_world_process_zero:
            loss = "-" if self.train_loss is None else f"{self.train_loss:.4f}"
            last = f" (last logged: {self.line()})" if self.line() else ""
            logger.info("%s finished: %d steps, train loss %s%s", self.stage, state.global_step, loss, last)

    def close(self) -> None:
        """End the bar where it stands (with its last numbers); a no-op once ended."""
        if self.bar is not None:
            self._show()
            self.bar.close()
            self.bar = None

    def line(self) -> str:
        """The key numbers as the progress line shows them: `loss=0.0123, reward=0.875, probe acc=0.95`."""
        numbers = dict(self.numbers)
        history = getattr(self.probe, "history", None)
        if history:
            numbers["probe acc"] = history[-1][1]
        return ", ".join(f"{label}={_short(value)}" for label, value in numbers.items())

    def _show(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self.line(), refresh=False)


def _short(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def replace_progress_display(trainer: Trainer, progress: ConsoleProgress) -> None:
    """`progress` in place of transformers' ProgressCallback and PrinterCallback (whichever the trainer has)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for shown in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(shown)
    trainer.add_callback(progress)


@contextlib.contextmanager
def console_progress(trainer: Trainer, stage: str) -> Iterator[ConsoleProgress]:
    """Show `trainer`'s training as one `ConsoleProgress` line, fed by its held-out probe if it has one; log lines
    written meanwhile (a checkpoint saved, a health alarm) go above the bar instead of through it."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    # the probe is found by what it has (a `history`), not by its class: importing the probe module would bring
    # generation and the rewards into the code key of every stage that trains (SFT too)
    callbacks = trainer.callback_handler.callbacks
    progress = ConsoleProgress(
        stage, next((c for c in callbacks if isinstance(getattr(c, "history", None), list)), None)
    )
    replace_progress_display(trainer, progress)
    with logging_redirect_tqdm():
        try:
            yield progress
        finally:  # training that raised never reached on_train_end
            progress.close()
