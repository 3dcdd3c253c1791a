"""Training-health alarms for GRPO rounds: catch a round that trains badly while it trains, not after evaluation.

A GRPO round can fail without an error: every group of completions gets one reward (zero advantage, so nothing to
learn; the design notes measured 93% such groups from a weak SFT start), the policy collapses onto a few answers
(entropy falls towards 0), completions shrink to nothing or run to the length limit, the policy drifts far from its
reference (KL, when beta > 0), most updates hit the clipping range, the reward never rises, the loss turns NaN, or
(with tools) almost every episode is still calling a tool when the turn limit is spent.
Each has an alarm whose threshold is in `monitors.*` (configs/monitors.py, MonitorsConfig).

Readings are window means over `monitors.window_steps` optimizer steps: the round's *start* is its first window,
*now* the latest one (TRL logs every `grpo.log_every_steps` steps, averaged over those steps). Two readings come
from the rewards themselves rather than from TRL's metrics: the fraction of groups with zero reward spread (TRL's
`frac_reward_zero_std` reads 0 with weighted rewards: the float32 std of equal weighted rewards is ~1e-8, not 0)
and the mean reward per step. A zero-spread group whose every completion is correct (the correctness reward gives
it full marks) is *solved*: it gives no gradient either, but because the policy has learned the prompt, so it does
not count towards the zero_spread alarm; when most groups are solved the round notes saturation (not an alarm,
nothing it holds back) and, with `monitors.stop_when_saturated`, ends.

Parts: `HealthMonitor` (tasks/training/monitor.py) is pure (readings in, alarms out) and unit-tested on synthetic
sequences; `RoundHealth` (here) is one round's glue (wraps the reward functions, reports alarms to the log and
MLflow, stops the round); `health_callback` adapts it to the transformers callback API.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import MonitorsConfig
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.training.consensus import agree, gather
from grpo_pipeline.tasks.training.monitor import (
    MLFLOW_TAG,
    SOLVED_METRIC,
    ZERO_SPREAD_METRIC,
    Alarm,
    HealthMonitor,
    StepRewards,
    TrainingHealthError,
    weighted_totals,
)

if TYPE_CHECKING:  # transformers and torch load when a round trains, not when the flow imports this module
    import torch
    from transformers import TrainerCallback


class RoundHealth:
    """One GRPO round's health watch: records the rewards the trainer computes, feeds `HealthMonitor`, and reports
    each alarm (log warning, MLflow tag `health.alarm.<kind>` and metric `health/alarm/<kind>` on the round's run,
    and `alarms`, the list the round's Checkpoint and meta.json carry). With `monitors.fail_fast`, or weights that
    are no longer finite, the first alarm raises TrainingHealthError."""

    def __init__(
        self,
        cfg: MonitorsConfig,
        stage: str,
        beta: float,
        group_size: int,
        weights: Sequence[float],
        correctness_index: int | None = None,
        max_tool_turns: int | None = None,
    ) -> None:
        self.cfg = cfg
        # A tool-using round's turn limit (grpo.max_tool_turns; None: no tools): the turn_limit alarm reads, from the
        # columns the rewards get, which episodes still called a tool when it was spent.
        self.max_tool_turns = max_tool_turns
        self._turn_limits: list[bool] | None = None
        # Which reward function is the correctness reward (a score >= 1.0 is a correct completion), to tell solved
        # zero-spread groups (saturation) from unsolved ones (the zero_spread alarm); None: no group counts as solved.
        self.correctness_index = correctness_index
        self.stage = stage
        self.beta = beta
        self.group_size = group_size
        self.weights = list(weights)
        self.monitor = HealthMonitor(cfg, beta)
        self.alarms: list[str] = []  # mutated in place: meta.json gets the list train_policy was given
        self.notes: list[str] = []  # what is worth saying but no alarm (saturation); also in meta.json
        self.stop_requested = False  # monitors.stop_when_saturated: the callback ends training after this step
        self._pending: dict[int, list[float | None]] = {}
        self._logged_to = 0
        self._warned_split = False

    # ------------------------------------------------------------------ rewards

    def wrap_rewards(self, fns: Sequence[Callable[..., Any]]) -> list[Callable[..., Any]]:
        """The reward functions, each recording its scores for the zero-spread reading; names are kept (TRL logs
        rewards by `__name__`) and a function's result is returned unchanged."""
        if len(fns) != len(self.weights):
            raise ValueError(f"{len(fns)} reward functions but {len(self.weights)} weights")
        return [self._recording(i, fn) for i, fn in enumerate(fns)]

    def _recording(self, index: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            async def record_async(*args: Any, **kwargs: Any) -> Any:
                scores = await fn(*args, **kwargs)
                self._pending[index] = list(scores)
                if index == 0:
                    self._turn_limits = self._read_turn_limits(kwargs)
                return scores

            return functools.update_wrapper(record_async, fn)

        def record(*args: Any, **kwargs: Any) -> Any:
            scores = fn(*args, **kwargs)
            self._pending[index] = list(scores)
            if index == 0:
                self._turn_limits = self._read_turn_limits(kwargs)
            return scores

        return functools.update_wrapper(record, fn)

    def _read_turn_limits(self, columns: Mapping[str, Any]) -> list[bool] | None:
        """Per completion of the step, whether it still called a tool when the turn limit was spent: the text loop's
        `tool_turn_limit` column (agents/text_tools.py), else read from TRL's loop's message lists; None without
        tools."""
        if self.max_tool_turns is None:
            return None
        if "tool_turn_limit" in columns:
            return [bool(hit) for hit in columns["tool_turn_limit"]]
        from grpo_pipeline.agents.chat_tools import turn_limit_hits

        return turn_limit_hits(columns.get("completions") or [], self.max_tool_turns)

    def _take_turn_limits(self) -> tuple[int, int] | None:
        """(hits, episodes) of this process's share of the step, once; None when it recorded none."""
        hits, self._turn_limits = self._turn_limits, None
        return None if hits is None else (sum(hits), len(hits))

    def _step_share(self) -> tuple[list[float], list[bool] | None] | None:
        """This process's share of the rewards scored during this step (if it generated): each completion's weighted
        reward and, with a correctness reward, whether it was correct; None when it scored nothing."""
        share = None
        if len(self._pending) == len(self.weights):
            totals = weighted_totals([self._pending[i] for i in range(len(self.weights))], self.weights)
            correct = None
            if self.correctness_index is not None:
                correct = [s is not None and s >= 1.0 for s in self._pending[self.correctness_index]]
            share = (totals, correct)
        self._pending.clear()
        return share

    def _record_rewards(self, step: int, shares: Sequence[tuple[list[float], list[bool] | None] | None]) -> None:
        """Hand the step's rewards to the monitor: every process's share, in process order (`consensus.gather`).
        TRL gathers the completions of all processes in that order and groups them there, so together the shares are
        the step's whole groups even when one process's share is not (prompts_per_step not a multiple of the process
        count). Should they still not split into groups, it says so once and skips the reading."""
        scored = [share for share in shares if share is not None]
        if not scored:
            return
        totals = [t for share, _ in scored for t in share]
        correct = None if any(c is None for _, c in scored) else [c for _, share in scored for c in share]
        if len(totals) % self.group_size == 0:
            self.monitor.record_rewards(step, StepRewards.of(totals, self.group_size, correct))
        elif not self._warned_split:
            self._warned_split = True
            logger.warning(
                "%s: the step's %d scored completions do not split into groups of %d; the zero-spread and stagnation "
                "readings are off",
                self.stage,
                len(totals),
                self.group_size,
            )

    # ------------------------------------------------------------------ trainer events

    def begin(self, step: int) -> None:
        """Training starts at `step` (> 0 when it resumes from a periodic checkpoint: the alarms the interrupted
        attempt raised are on its MLflow run, which the resumed attempt continues, and are kept)."""
        self.monitor = HealthMonitor(self.cfg, self.beta, first_step=step)
        self._logged_to = step
        if step > 0:
            for tag, value in agree(sorted(_run_tags().items())):  # process 0's: only it has the MLflow run
                if tag.startswith(f"{MLFLOW_TAG}alarm.") and value not in self.alarms:
                    self.alarms.append(value)
                    self.monitor.fired.add(tag.removeprefix(f"{MLFLOW_TAG}alarm."))
            if self.alarms and self.cfg.fail_fast:
                raise TrainingHealthError(
                    f"{self.stage} resumed at step {step}, but it had already raised a training-health alarm "
                    f"(monitors.fail_fast is on): {self.alarms[0]}"
                )

    def step_end(self, step: int, model: torch.nn.Module | None) -> None:
        bad = nonfinite_parameter(model) if model is not None else None  # a sharded model: this process's shard
        shares = gather((self._step_share(), bad, self._take_turn_limits()))
        self._record_rewards(step, [share for share, _, _ in shares])
        turns = [t for _, _, t in shares if t is not None]
        if turns:
            self.monitor.record_turn_limits(step, sum(h for h, _ in turns), sum(n for _, n in turns))
        alarms = self.monitor.check(step)
        bad = next((name for _, name, _ in shares if name is not None), None)
        if bad is not None:
            alarms.append(
                Alarm(
                    "nonfinite_loss",
                    step,
                    f"the weights are not finite after this step ({bad}): the loss or its gradient was NaN or inf, "
                    "and no rollout can be sampled from this policy; lower grpo.learning_rate or train in float32",
                    fatal=True,
                )
            )
        self._decide(alarms)

    def _decide(self, alarms: list[Alarm]) -> None:
        """Report process 0's alarms and saturation, and stop (fail_fast, a fatal alarm, stop_when_saturated) by
        them, on every process: each process's monitor reads the same gathered figures, and process 0's verdict is
        the one they all act on, so no process stops while another trains on."""
        alarms, saturation = agree((alarms, self.monitor.saturation))
        self.monitor.fired.update(alarm.kind for alarm in alarms)
        self.monitor.saturation = saturation
        self._report(alarms)
        self._note_saturation()

    def _note_saturation(self) -> None:
        saturation = self.monitor.saturation
        if saturation is None or str(saturation) in self.notes:
            return
        self.notes.append(str(saturation))
        logger.info("%s: %s", self.stage, saturation)
        _set_tags({f"{MLFLOW_TAG}saturated": str(saturation)[:5000]})
        _log_metrics({"health/saturated": 1.0}, saturation.step)
        if self.cfg.stop_when_saturated:
            self.stop_requested = True
            logger.info("%s: ending the round at step %d (monitors.stop_when_saturated)", self.stage, saturation.step)

    def log(self, step: int, logs: Mapping[str, Any]) -> None:
        self.monitor.record_logs(step, logs)
        zero = self.monitor.zero_spread_fraction(self._logged_to, step)
        if zero is not None:
            solved = self.monitor.zero_spread_fraction(self._logged_to, step, "solved") or 0.0
            _log_metrics({ZERO_SPREAD_METRIC: zero, SOLVED_METRIC: solved}, step)
            self._logged_to = step
        self._decide(self.monitor.check(step))

    def end(self) -> None:
        _set_tags({f"{MLFLOW_TAG}status": "unhealthy" if self.alarms else "healthy"})
        if self.alarms:
            logger.warning("%s finished with %d training-health alarm(s)", self.stage, len(self.alarms))
        else:
            logger.info("%s: no training-health alarm", self.stage)

    def _report(self, alarms: Sequence[Alarm]) -> None:
        for alarm in alarms:
            self.alarms.append(str(alarm))
            logger.warning("%s training-health alarm: %s", self.stage, alarm)
            # MLflow caps tag values (5000 characters for run tags)
            _set_tags({f"{MLFLOW_TAG}alarm.{alarm.kind}": str(alarm)[:5000], f"{MLFLOW_TAG}status": "unhealthy"})
            _log_metrics({f"health/alarm/{alarm.kind}": 1.0}, alarm.step)
        stop = next((a for a in alarms if a.fatal or self.cfg.fail_fast), None)
        if stop is not None:
            why = "it cannot go on" if stop.fatal else "monitors.fail_fast is on"
            raise TrainingHealthError(
                f"{self.stage} stopped at step {stop.step} by a training-health alarm ({why}): {stop}. "
                + ("" if stop.fatal else "Set monitors.fail_fast=false to finish such a round anyway (it can then be ")
                + ("" if stop.fatal else "registered as challenger only).")
            )


def nonfinite_parameter(model: torch.nn.Module) -> str | None:
    """The name of the first parameter holding a NaN or inf, else None.

    Cheap enough for every step: one float32 sum per parameter and one device sync (a NaN or inf anywhere makes its
    sum non-finite; float32 keeps the sums of sane weights, float16 ones too, far from overflow). Only when a sum is
    not finite are the elements checked, which also tells weights that are huge but finite from NaN or inf."""
    import torch

    with torch.no_grad():
        by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        for name, p in model.named_parameters():
            if p.numel():
                by_device.setdefault(p.device, []).append((name, p))
        for group in by_device.values():
            sums = torch.stack([p.sum(dtype=torch.float32) for _, p in group])
            if bool(torch.isfinite(sums).all()):
                continue
            for name, p in group:
                if not bool(torch.isfinite(p).all()):
                    return name
    return None


def health_callback(health: RoundHealth) -> TrainerCallback:
    """The transformers callback that feeds `health` (built here so that importing this module loads no
    transformers)."""
    from transformers import TrainerCallback

    class HealthCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            health.begin(state.global_step)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            health.step_end(state.global_step, model)
            if health.stop_requested:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            health.log(state.global_step, logs or {})

        def on_train_end(self, args, state, control, **kwargs):
            health.end()

    return HealthCallback()


def _run_tags() -> dict[str, str]:
    import mlflow

    run = mlflow.active_run()
    return dict(mlflow.get_run(run.info.run_id).data.tags) if run is not None else {}


def _set_tags(tags: dict[str, str]) -> None:
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.set_tags(tags)


def _log_metrics(metrics: dict[str, float], step: int) -> None:
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.log_metrics(metrics, step=step)
