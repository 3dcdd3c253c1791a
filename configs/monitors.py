"""The `monitors:` section: training-health alarms of the GRPO rounds (tasks/training/health.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pipeline.configs.base import Section


class MonitorsConfig(Section):
    """Training-health alarms watched in every GRPO round (tasks/training/health.py). An alarm is logged, set as a tag
    and metric on the round's MLflow run, listed in the run summary, and keeps the round from taking `champion`
    (unless registry.allow_unhealthy). The defaults stay silent on the default recipe (see docs/monitors.md)."""

    enabled: bool = Field(default=True, description="Watch GRPO rounds for the alarms below.")
    window_steps: int = Field(
        default=20,
        ge=1,
        description="Optimizer steps averaged into one reading: a round's start is the mean over its first window, "
        "'now' the mean over the latest one. Ratios to the start are checked once the two windows no longer overlap.",
    )
    zero_spread_max: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Alarm when more than this fraction of the prompt groups in a window got the same weighted "
        "reward for every completion (zero advantage, no gradient) without being solved: all wrong, or equally "
        "partly right. Computed from the rewards themselves; logged as health/zero_spread_frac (every zero-spread "
        "group) and health/solved_frac (the solved ones, which are saturation, not this alarm).",
    )
    saturated_min: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Saturation, a note and not an alarm: when more than this fraction of the prompt groups in a "
        "window were solved (every completion right on the correctness reward, eval.correctness_reward), the round "
        "says so (log, MLflow tag health.saturated, run summary). Such groups do not count towards zero_spread_max.",
    )
    stop_when_saturated: bool = Field(
        default=False,
        description="End the round at saturation (a normal end: the policy is kept and evaluated as usual).",
    )
    kl_max: float = Field(
        default=1.0,
        gt=0,
        description="Alarm when the window-mean per-token KL to the reference model (TRL's `kl`, nats) exceeds "
        "this; only checked when grpo.beta > 0.",
    )
    entropy_min_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Entropy collapse: alarm when the window-mean token entropy falls below this fraction of its "
        "value at the round's start.",
    )
    length_min_ratio: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="Alarm when the window-mean completion length (tokens) falls below this fraction of its start.",
    )
    length_max_ratio: float = Field(
        default=2.0,
        gt=1,
        description="Alarm when the window-mean completion length (tokens) grows above this multiple of its start.",
    )
    clip_ratio_max: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Alarm when the window-mean fraction of tokens whose importance ratio is clipped (TRL's "
        "clip_ratio/region_mean) exceeds this. Only off-policy updates clip (several passes over a batch, vLLM).",
    )
    stagnation_steps: int = Field(
        default=100,
        ge=0,
        description="Reward stagnation: alarm when, this many steps into a round, no window-mean reward has risen "
        "more than stagnation_min_gain above the start window's. 0 turns it off.",
    )
    stagnation_min_gain: float = Field(
        default=0.0,
        ge=0,
        description="The rise of the mean reward (in reward units, weights applied) that counts as progress.",
    )
    turn_limit_max: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Tool-using rounds (grpo.tools, grpo.environment): alarm when more than this fraction of the "
        "episodes in a window still asked for a tool when grpo.max_tool_turns was spent (the call was not run): the "
        "policy calls instead of answering, and its rewards score cut-off episodes.",
    )
    sft_min_ratio: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Before GRPO (tasks/sft_check.py): the SFT policy has not learned its data when its greedy "
        "held-out accuracy is below this fraction of the accuracy of its own training targets (the correctness "
        "reward's verdict on the `completion` column). 0 turns the check off.",
    )
    sft_not_learned: Literal["warn", "error"] = Field(
        default="warn",
        description="What an SFT that has not learned its data does: 'warn' (one warning with the figures, carried "
        "by the run summary and the model card) or 'error' (the run stops before GRPO).",
    )
    fail_fast: bool = Field(
        default=False,
        description="Stop the round at its first alarm with TrainingHealthError (not retried) instead of finishing "
        "it. A loss that turns NaN or inf stops the round either way: its weights are no longer finite.",
    )

    @model_validator(mode="after")
    def _windows_fit(self) -> MonitorsConfig:
        if self.stagnation_steps and self.stagnation_steps <= self.window_steps:
            raise ValueError(
                f"stagnation_steps ({self.stagnation_steps}) must exceed window_steps ({self.window_steps}), the "
                "start window it compares with; raise it or set it to 0 to turn the check off"
            )
        return self
