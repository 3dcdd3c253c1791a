"""Training-health alarms for GRPO rounds: catch a round that trains badly while it trains, not after evaluation.

A GRPO round can fail without an error: every group of completions gets one reward (zero advantage, so nothing to
learn; the design notes measured 93% such groups from a weak SFT start), the policy collapses onto a few answers
(entropy falls towards 0), completions shrink to nothing or run to the length limit, the policy drifts far from its
reference (KL, when beta > 0), most updates hit the clipping range, the reward never rises, or the loss turns NaN.
Each has an alarm whose threshold is in `monitors.*` (configs/schema.py, MonitorsConfig).

Readings are window means over `monitors.window_steps` optimizer steps: the round's *start* is its first window,
*now* the latest one (TRL logs every `grpo.log_every_steps` steps, averaged over those steps). Two readings come
from the rewards themselves rather than from TRL's metrics: the fraction of groups with zero reward spread (TRL's
`frac_reward_zero_std` reads 0 with weighted rewards: the float32 std of equal weighted rewards is ~1e-8, not 0)
and the mean reward per step.

Parts: `HealthMonitor` is pure (readings in, alarms out) and unit-tested on synthetic sequences; `RoundHealth` is
one round's glue (wraps the reward functions, reports alarms to the log and MLflow, stops the round);
`health_callback` adapts it to the transformers callback API.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import MonitorsConfig
from grpo_pipeline.tasks.core.common import logger

if TYPE_CHECKING:  # transformers and torch load when a round trains, not when the flow imports this module
    import torch
    from transformers import TrainerCallback

# Two weighted rewards closer than this are equal: float32 sums of equal rewards differ by ~1e-7.
ZERO_SPREAD_TOL = 1e-6
# TRL's names for the logged metrics this module reads (trl 1.16: GRPOTrainer._compute_loss logs kl, entropy and
# clip_ratio/*, GRPOTrainer._generate completions/*).
TRL_KEYS = {
    "kl": "kl",
    "entropy": "entropy",
    "length": "completions/mean_length",
    "clip": "clip_ratio/region_mean",
}
# Alarms on a reading's ratio to its start: kind -> (reading, monitors field, fires above (else below), what, hint).
RATIO_ALARMS = {
    "entropy_collapse": (
        "entropy",
        "entropy_min_ratio",
        False,
        "mean token entropy",
        "the policy is collapsing onto a few answers; lower grpo.learning_rate or raise grpo.temperature",
    ),
    "length_collapse": (
        "length",
        "length_min_ratio",
        False,
        "mean completion length",
        "completions are shrinking; look for a reward that favours short (or empty) outputs, or lower "
        "grpo.learning_rate",
    ),
    "length_blowup": (
        "length",
        "length_max_ratio",
        True,
        "mean completion length",
        "completions are growing towards grpo.max_completion_tokens; look for a reward that favours long outputs, "
        "or lower grpo.learning_rate",
    ),
}
MLFLOW_TAG = "health."  # health.status and health.alarm.<kind> on the round's run
ZERO_SPREAD_METRIC = "health/zero_spread_frac"


class TrainingHealthError(RuntimeError):
    """A GRPO round stopped by a training-health alarm (monitors.fail_fast, or weights that are no longer finite).

    Retrying would train the same way into the same alarm, so the pipeline does not retry it."""


@dataclass(frozen=True)
class Alarm:
    kind: str  # zero_spread, kl, entropy_collapse, length_collapse, length_blowup, clip_ratio, ...
    step: int
    message: str
    fatal: bool = False  # the round cannot go on, whatever monitors.fail_fast says

    def __str__(self) -> str:
        return f"{self.kind} at step {self.step}: {self.message}"


@dataclass
class Series:
    """Readings of one quantity, in step order, each with the weight (steps or samples) it stands for in a mean."""

    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    def add(self, step: int, value: float | None, weight: float = 1.0) -> None:
        if value is not None and math.isfinite(value) and weight > 0:
            self.steps.append(step)
            self.values.append(float(value))
            self.weights.append(float(weight))

    def mean(self, lo: int, hi: int, latest_if_empty: bool = True) -> float | None:
        """Weighted mean of the readings with lo < step <= hi. When none falls inside (readings sparser than the
        window), the latest one at or before hi, unless `latest_if_empty` is false; None without any reading."""
        i, j = bisect.bisect_right(self.steps, lo), bisect.bisect_right(self.steps, hi)
        if i == j:
            if not latest_if_empty or j == 0:
                return None
            i = j - 1
        total = sum(self.weights[i:j])
        return sum(v * w for v, w in zip(self.values[i:j], self.weights[i:j], strict=True)) / total

    def first_step_from(self, step: int) -> int | None:
        """The step of the first reading at or after `step` (the reading that completes the start window)."""
        k = bisect.bisect_left(self.steps, step)
        return self.steps[k] if k < len(self.steps) else None


def alarm_kinds(alarms: Sequence[str]) -> list[str]:
    """The kinds of alarms given as their text (`str(Alarm)`: '<kind> at step <n>: <message>'), in order."""
    return [text.split(" ", 1)[0] for text in alarms]


def health_tags(alarms: Sequence[str]) -> dict[str, str]:
    """The `training_health` tag of a registered version: 'healthy', or 'unhealthy: <the alarms' kinds>' (the
    alarms themselves are `health.alarm.<kind>` tags on the round's run)."""
    kinds = ", ".join(alarm_kinds(alarms))
    return {"training_health": f"unhealthy: {kinds}" if alarms else "healthy"}


def weighted_totals(scores: Sequence[Sequence[float | None]], weights: Sequence[float]) -> list[float]:
    """Each completion's weighted reward, as TRL sums it (GRPOTrainer._generate_and_score_completions): None counts
    as 0 beside a scored reward, and a completion no reward function scored is NaN (TRL leaves it out).

    `scores` is one list per reward function (reward function x completion)."""
    totals = []
    for column in zip(*scores, strict=True):
        scored = [(s, w) for s, w in zip(column, weights, strict=True) if s is not None and not math.isnan(s)]
        totals.append(sum(s * w for s, w in scored) if scored else math.nan)
    return totals


@dataclass(frozen=True)
class StepRewards:
    """What one step's weighted rewards say: how many prompt groups, how many with zero spread (and their mean
    reward), and the mean reward of the scored completions."""

    groups: int
    zero_spread: int
    zero_spread_reward: float | None  # mean reward of the zero-spread groups (None: there are none)
    mean: float | None  # None: no completion was scored
    scored: int

    @classmethod
    def of(cls, totals: Sequence[float], group_size: int) -> StepRewards:
        """From the weighted rewards of consecutive groups of `group_size` completions (TRL's order: the G
        completions of a prompt are adjacent; NaN = unscored). A group's spread is max - min of its scored rewards;
        a group with fewer than two scored completions has none either (its advantages are 0)."""
        if len(totals) % group_size:
            raise ValueError(f"{len(totals)} rewards do not split into groups of {group_size} completions")
        zero_means = []
        for i in range(0, len(totals), group_size):
            group = [t for t in totals[i : i + group_size] if not math.isnan(t)]
            if len(group) < 2 or max(group) - min(group) <= ZERO_SPREAD_TOL:
                zero_means.append(sum(group) / len(group) if group else 0.0)
        scored = [t for t in totals if not math.isnan(t)]
        return cls(
            groups=len(totals) // group_size,
            zero_spread=len(zero_means),
            zero_spread_reward=sum(zero_means) / len(zero_means) if zero_means else None,
            mean=sum(scored) / len(scored) if scored else None,
            scored=len(scored),
        )


class HealthMonitor:
    """The alarm logic of one round, without the trainer: feed it readings, ask it for new alarms.

    `record_rewards` takes each step's weighted rewards (zero spread, reward stagnation), `record_logs` TRL's logged
    metrics (KL, entropy, completion length, clip ratio, loss). `check(step)` returns the alarms that have become
    true, each kind once per round."""

    def __init__(self, cfg: MonitorsConfig, beta: float = 0.0, first_step: int = 0) -> None:
        self.cfg = cfg
        self.beta = beta
        self.first_step = first_step  # > 0 when a round resumes from a periodic checkpoint
        self.series: dict[str, Series] = {name: Series() for name in (*TRL_KEYS, "reward", "zero_spread")}
        self.zero_spread_reward = Series()  # mean reward of the zero-spread groups, for the message
        self.fired: set[str] = set()
        self.best_reward: float | None = None
        self.nonfinite: tuple[int, str] | None = None
        self._starts: dict[str, tuple[float, int]] = {}  # fixed once the first window is complete
        self._last_log_step = first_step

    # ------------------------------------------------------------------ readings

    def record_rewards(self, step: int, rewards: StepRewards) -> None:
        """What the rewards of the completions generated for `step` say (see StepRewards.of)."""
        if rewards.groups:
            self.series["zero_spread"].add(step, rewards.zero_spread / rewards.groups, rewards.groups)
        self.zero_spread_reward.add(step, rewards.zero_spread_reward, rewards.zero_spread)
        self.series["reward"].add(step, rewards.mean, rewards.scored)

    def record_logs(self, step: int, logs: Mapping[str, Any]) -> None:
        """TRL's logs at `step` (each value a mean over the steps since the previous log)."""
        if not any(key in logs for key in ("loss", *TRL_KEYS.values())):
            return  # e.g. the end-of-training summary (train_runtime, train_loss)
        covered = max(step - self._last_log_step, 1)
        self._last_log_step = step
        for name, key in TRL_KEYS.items():
            value = logs.get(key)
            if isinstance(value, int | float):
                self.series[name].add(step, value, covered)
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, int | float) and not math.isfinite(value) and self.nonfinite is None:
                self.nonfinite = (step, f"the logged {key} is {value}")

    def zero_spread_fraction(self, lo: int, hi: int) -> float | None:
        """The fraction of groups with zero reward spread over steps lo < step <= hi (no reading: None)."""
        return self.series["zero_spread"].mean(lo, hi, latest_if_empty=False)

    # ------------------------------------------------------------------ alarms

    def check(self, step: int) -> list[Alarm]:
        """The alarms that are true at `step` and have not fired before in this round."""
        cfg, w = self.cfg, self.cfg.window_steps
        found: list[Alarm] = []

        def fire(kind: str, message: str) -> None:
            if kind not in self.fired:
                self.fired.add(kind)
                found.append(Alarm(kind, step, message))

        if self.nonfinite is not None:
            at, what = self.nonfinite
            fire("nonfinite_loss", f"{what} (step {at}); lower grpo.learning_rate or train in float32")
        if step < self.first_step + w:
            return found  # the first window is not complete yet
        lo = step - w
        span = f"steps {max(lo, self.first_step) + 1}-{step}"

        zero = self.zero_spread_fraction(lo, step)
        if zero is not None and zero > cfg.zero_spread_max:
            mean = self.zero_spread_reward.mean(lo, step)
            fire(
                "zero_spread",
                f"{zero:.0%} of the prompt groups over {span} had zero reward spread (every completion of the prompt "
                f"got the same reward{'' if mean is None else f', on average {mean:.3g}'}), above "
                f"monitors.zero_spread_max={cfg.zero_spread_max}: those groups give no advantage and no gradient. "
                "Give the policy prompts it sometimes solves (a stronger SFT warmup, grpo.difficulty_filter) or a "
                "denser reward",
            )
        if self.beta > 0 and (kl := self.series["kl"].mean(lo, step)) is not None and kl > cfg.kl_max:
            fire(
                "kl",
                f"mean per-token KL to the reference over {span} is {kl:.3g}, above monitors.kl_max={cfg.kl_max}: "
                "the policy has drifted far from its reference; lower grpo.learning_rate or raise grpo.beta",
            )
        if (clip := self.series["clip"].mean(lo, step)) is not None and clip > cfg.clip_ratio_max:
            fire(
                "clip_ratio",
                f"{clip:.1%} of the tokens over {span} had their importance ratio clipped, above "
                f"monitors.clip_ratio_max={cfg.clip_ratio_max}: the updates move the policy further than "
                "grpo.epsilon allows; lower grpo.learning_rate or raise grpo.epsilon",
            )
        self._check_against_start(step, fire)
        self._check_stagnation(step, fire)
        return found

    def _start(self, name: str) -> tuple[float, int] | None:
        """(the mean over the round's first window, the step that window ends at), once it is complete."""
        if name not in self._starts:
            series = self.series[name]
            end = series.first_step_from(self.first_step + self.cfg.window_steps)
            mean = None if end is None else series.mean(self.first_step, end)
            if end is None or mean is None:
                return None
            self._starts[name] = (mean, end)
        return self._starts[name]

    def _check_against_start(self, step: int, fire: Callable[[str, str], None]) -> None:
        w = self.cfg.window_steps
        for kind, (name, setting, above, what, hint) in RATIO_ALARMS.items():
            start = self._start(name)
            if start is None or start[0] <= 0 or step - w < start[1]:
                continue  # no start yet, or the 'now' window still overlaps it
            now = self.series[name].mean(step - w, step)
            if now is None:
                continue
            ratio, limit = now / start[0], getattr(self.cfg, setting)
            if (ratio > limit) if above else (ratio < limit):
                fire(
                    kind,
                    f"{what} over steps {step - w + 1}-{step} is {now:.3g}, {ratio:.2f}x its start {start[0]:.3g} "
                    f"(monitors.{setting}={limit}); {hint}",
                )

    def _check_stagnation(self, step: int, fire: Callable[[str, str], None]) -> None:
        cfg = self.cfg
        start = self._start("reward")
        if not cfg.stagnation_steps or start is None or step <= start[1]:
            return
        now = self.series["reward"].mean(step - cfg.window_steps, step)
        if now is not None:
            self.best_reward = now if self.best_reward is None else max(self.best_reward, now)
        if step >= self.first_step + cfg.stagnation_steps and self.best_reward is not None:
            gain = self.best_reward - start[0]
            if gain <= cfg.stagnation_min_gain:
                fire(
                    "reward_stagnation",
                    f"in {step - self.first_step} steps the window-mean reward never rose more than "
                    f"monitors.stagnation_min_gain={cfg.stagnation_min_gain} above its start {start[0]:.3g} (best "
                    f"{self.best_reward:.3g}); check that the reward can vary between completions and that "
                    "grpo.learning_rate is not too low (or so high that the policy degrades)",
                )


class RoundHealth:
    """One GRPO round's health watch: records the rewards the trainer computes, feeds `HealthMonitor`, and reports
    each alarm (log warning, MLflow tag `health.alarm.<kind>` and metric `health/alarm/<kind>` on the round's run,
    and `alarms`, the list the round's Checkpoint and meta.json carry). With `monitors.fail_fast`, or weights that
    are no longer finite, the first alarm raises TrainingHealthError."""

    def __init__(self, cfg: MonitorsConfig, stage: str, beta: float, group_size: int, weights: Sequence[float]) -> None:
        self.cfg = cfg
        self.stage = stage
        self.beta = beta
        self.group_size = group_size
        self.weights = list(weights)
        self.monitor = HealthMonitor(cfg, beta)
        self.alarms: list[str] = []  # mutated in place: meta.json gets the list train_policy was given
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
                return scores

            return functools.update_wrapper(record_async, fn)

        def record(*args: Any, **kwargs: Any) -> Any:
            scores = fn(*args, **kwargs)
            self._pending[index] = list(scores)
            return scores

        return functools.update_wrapper(record, fn)

    def _flush_rewards(self, step: int) -> None:
        """Hand the rewards scored during this step (if it generated) to the monitor. A process that holds a share
        of the step's completions which does not split into whole groups (multi-process training with prompts_per_step
        not a multiple of the process count) cannot read the groups; it says so once and skips the reading."""
        if len(self._pending) == len(self.weights):
            totals = weighted_totals([self._pending[i] for i in range(len(self.weights))], self.weights)
            if len(totals) % self.group_size == 0:
                self.monitor.record_rewards(step, StepRewards.of(totals, self.group_size))
            elif not self._warned_split:
                self._warned_split = True
                logger.warning(
                    "%s: this process scored %d completions, not whole groups of %d; the zero-spread and stagnation "
                    "readings are off here",
                    self.stage,
                    len(totals),
                    self.group_size,
                )
        self._pending.clear()

    # ------------------------------------------------------------------ trainer events

    def begin(self, step: int) -> None:
        """Training starts at `step` (> 0 when it resumes from a periodic checkpoint: the alarms the interrupted
        attempt raised are on its MLflow run, which the resumed attempt continues, and are kept)."""
        self.monitor = HealthMonitor(self.cfg, self.beta, first_step=step)
        self._logged_to = step
        if step > 0:
            for tag, value in sorted(_run_tags().items()):
                if tag.startswith(f"{MLFLOW_TAG}alarm.") and value not in self.alarms:
                    self.alarms.append(value)
                    self.monitor.fired.add(tag.removeprefix(f"{MLFLOW_TAG}alarm."))
            if self.alarms and self.cfg.fail_fast:
                raise TrainingHealthError(
                    f"{self.stage} resumed at step {step}, but it had already raised a training-health alarm "
                    f"(monitors.fail_fast is on): {self.alarms[0]}"
                )

    def step_end(self, step: int, model: torch.nn.Module | None) -> None:
        self._flush_rewards(step)
        alarms = self.monitor.check(step)
        if model is not None and (bad := nonfinite_parameter(model)) is not None:
            alarms.append(
                Alarm(
                    "nonfinite_loss",
                    step,
                    f"the weights are not finite after this step ({bad}): the loss or its gradient was NaN or inf, "
                    "and no rollout can be sampled from this policy; lower grpo.learning_rate or train in float32",
                    fatal=True,
                )
            )
        self._report(alarms)

    def log(self, step: int, logs: Mapping[str, Any]) -> None:
        self.monitor.record_logs(step, logs)
        zero = self.monitor.zero_spread_fraction(self._logged_to, step)
        if zero is not None:
            _log_metrics({ZERO_SPREAD_METRIC: zero}, step)
            self._logged_to = step
        self._report(self.monitor.check(step))

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

        def on_log(self, args, state, control, logs=None, **kwargs):
            health.log(state.global_step, logs or {})

        def on_train_end(self, args, state, control, **kwargs):
            health.end()

    return HealthCallback()


# ---------------------------------------------------------------------- MLflow (the round's active run, if any)


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
