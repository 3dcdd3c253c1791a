"""Training-health alarms, the pure part: readings in, alarms out (`HealthMonitor`), unit-tested on synthetic
sequences. What each alarm means and how readings are taken: tasks/training/health.py."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_pipeline.configs.schema import MonitorsConfig

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
SOLVED_METRIC = "health/solved_frac"  # the zero-spread groups whose every completion is correct


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
    reward), how many of those are solved (every completion correct), and the mean reward of the scored completions.

    A zero-spread group gives no gradient either way, but for opposite reasons: all wrong, the policy has no signal
    on that prompt (an alarm when most groups are so); all right, it has solved the prompt (saturation: success)."""

    groups: int
    zero_spread: int
    zero_spread_reward: float | None  # mean reward of the zero-spread groups that are not solved (None: none)
    mean: float | None  # None: no completion was scored
    scored: int
    solved: int = 0  # zero-spread groups whose every completion got full marks from the correctness reward

    @property
    def no_signal(self) -> int:
        """Zero-spread groups that are not solved: the ones that say the policy cannot learn from that prompt."""
        return self.zero_spread - self.solved

    @classmethod
    def of(cls, totals: Sequence[float], group_size: int, correct: Sequence[bool] | None = None) -> StepRewards:
        """From the weighted rewards of consecutive groups of `group_size` completions (TRL's order: the G
        completions of a prompt are adjacent; NaN = unscored). A group's spread is max - min of its scored rewards;
        a group with fewer than two scored completions has none either (its advantages are 0). `correct` (one per
        completion, from the correctness reward) tells solved groups apart; without it none counts as solved."""
        if len(totals) % group_size:
            raise ValueError(f"{len(totals)} rewards do not split into groups of {group_size} completions")
        if correct is not None and len(correct) != len(totals):
            raise ValueError(f"{len(correct)} correctness readings for {len(totals)} rewards")
        zero_means, solved = [], 0
        for i in range(0, len(totals), group_size):
            group = [t for t in totals[i : i + group_size] if not math.isnan(t)]
            if len(group) < 2 or max(group) - min(group) <= ZERO_SPREAD_TOL:
                if correct is not None and len(group) == group_size and all(correct[i : i + group_size]):
                    solved += 1
                else:
                    zero_means.append(sum(group) / len(group) if group else 0.0)
        scored = [t for t in totals if not math.isnan(t)]
        return cls(
            groups=len(totals) // group_size,
            zero_spread=len(zero_means) + solved,
            zero_spread_reward=sum(zero_means) / len(zero_means) if zero_means else None,
            mean=sum(scored) / len(scored) if scored else None,
            scored=len(scored),
            solved=solved,
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
        names = (*TRL_KEYS, "reward", "zero_spread", "no_signal", "solved", "turn_limit")
        self.series: dict[str, Series] = {name: Series() for name in names}
        self.zero_spread_reward = Series()  # mean reward of the unsolved zero-spread groups, for the message
        self.saturation: Alarm | None = None  # set once, when most groups are solved: a note, not an alarm
        self.fired: set[str] = set()
        self.best_reward: float | None = None
        self.nonfinite: tuple[int, str] | None = None
        self._starts: dict[str, tuple[float, int]] = {}  # fixed once the first window is complete
        self._last_log_step = first_step

    # ------------------------------------------------------------------ readings

    def record_rewards(self, step: int, rewards: StepRewards) -> None:
        """What the rewards of the completions generated for `step` say (see StepRewards.of)."""
        if rewards.groups:
            for name, count in (("zero_spread", rewards.zero_spread), ("no_signal", rewards.no_signal)):
                self.series[name].add(step, count / rewards.groups, rewards.groups)
            self.series["solved"].add(step, rewards.solved / rewards.groups, rewards.groups)
        self.zero_spread_reward.add(step, rewards.zero_spread_reward, rewards.no_signal)
        self.series["reward"].add(step, rewards.mean, rewards.scored)

    def record_turn_limits(self, step: int, hits: int, episodes: int) -> None:
        """Of the `episodes` generated for `step` (a tool-using round), `hits` still asked for a tool when the turn
        limit was spent."""
        if episodes:
            self.series["turn_limit"].add(step, hits / episodes, episodes)

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

    def zero_spread_fraction(self, lo: int, hi: int, which: str = "zero_spread") -> float | None:
        """The fraction of groups with zero reward spread over steps lo < step <= hi (no reading: None); `which`:
        "zero_spread" all of them, "no_signal" the unsolved ones, "solved" the solved ones."""
        return self.series[which].mean(lo, hi, latest_if_empty=False)

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

        zero = self.zero_spread_fraction(lo, step, "no_signal")
        if zero is not None and zero > cfg.zero_spread_max:
            mean = self.zero_spread_reward.mean(lo, step)
            fire(
                "zero_spread",
                f"{zero:.0%} of the prompt groups over {span} had zero reward spread without being solved (every "
                f"completion of the prompt got the same reward{'' if mean is None else f', on average {mean:.3g}'}), "
                f"above monitors.zero_spread_max={cfg.zero_spread_max}: those groups give no advantage and no "
                "gradient. Give the policy prompts it sometimes solves (a stronger SFT warmup, "
                "grpo.difficulty_filter) or a denser reward",
            )
        self._check_saturation(step, lo, span)
        turn = self.series["turn_limit"].mean(lo, step, latest_if_empty=False)
        if turn is not None and turn > cfg.turn_limit_max:
            fire(
                "turn_limit",
                f"{turn:.0%} of the episodes over {span} still called a tool when grpo.max_tool_turns was spent (the "
                f"call was not run), above monitors.turn_limit_max={cfg.turn_limit_max}: the policy calls instead of "
                "answering, and the rewards score cut-off episodes. Raise grpo.max_tool_turns, check that the tool's "
                "results let it answer (tools/failure_frequency), or teach answering after a result in the SFT data",
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

    def _check_saturation(self, step: int, lo: int, span: str) -> None:
        solved = self.zero_spread_fraction(lo, step, "solved")
        if self.saturation is None and solved is not None and solved > self.cfg.saturated_min:
            self.saturation = Alarm(
                "saturated",
                step,
                f"{solved:.0%} of the prompt groups over {span} were solved (every completion correct), above "
                f"monitors.saturated_min={self.cfg.saturated_min}: the policy has little left to learn from these "
                "prompts (success, not an alarm)",
            )

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
