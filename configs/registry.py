"""The `registry:` section: the MLflow experiment and registered model, and the champion gate
(tasks/release/gate.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from grpo_pipeline.configs.base import Section
from grpo_pipeline.configs.metrics import split_metric


class RegistryConfig(Section):
    experiment: str = Field(default="grpo-pipeline", description="MLflow experiment name.")
    model_name: str = Field(default="tiny-arith-grpo", description="Registered model name in MLflow.")
    gating_metric: str = Field(
        default="accuracy",
        description="Eval metric that decides champion vs challenger (higher is better): accuracy, pass_at_<k>, "
        "maj_at_<k> or reward/<name>, of the first eval suite, or of a named one as `<suite>/<metric>` "
        "(`gsm8k_test/accuracy`); one the evaluation produces (configs/metrics.py: k from the suite's k, reward/ on "
        "held-out suites only), checked when the config loads.",
    )
    guard: list[str] = Field(
        default=[],
        description="Suite metrics that must not regress (`<suite>/<metric>`, or a bare metric of the first suite; "
        "named as gating_metric is): "
        "a challenger that wins on gating_metric is promoted only when, for each of these, the lower bound of the "
        "paired bootstrap 95% CI of its difference to the champion on the same items is above -guard_margin "
        "(non-inferiority).",
    )
    guard_every_suite: bool = Field(
        default=False,
        description="Guard the gating metric on every eval suite but the gating one too, as if each were listed in "
        "guard: a version is promoted only when it gains where it is gated and keeps every other suite (what a "
        "retraining run on new data must not lose; the nightly deployment sets it).",
    )
    guard_margin: float = Field(
        default=0.02,
        ge=0,
        description="How much worse than the champion a guarded metric may be (absolute, e.g. 0.02 = 2 points of "
        "accuracy) before it blocks a promotion.",
    )
    min_delta: float = Field(
        default=0.0,
        description="Promotion margin: the new version takes `champion` only when the lower bound of the paired "
        "bootstrap 95% CI of its gating-metric difference to the champion (same eval items) is above this.",
    )
    register_each_round: bool = Field(default=True, description="Register every round, not only the last.")
    allow_unhealthy: bool = Field(
        default=False,
        description="Let a GRPO round that raised a training-health alarm (monitors.*) take `champion` when the gate "
        "promotes it; by default such a round is registered as `challenger` only.",
    )

    def guarded(self, suites: Sequence[str]) -> list[str]:
        """The guarded metrics of an evaluation on `suites`: `guard`, and with `guard_every_suite` the gating metric
        on every other suite (`<suite>/<metric>`)."""
        if not self.guard_every_suite:
            return list(self.guard)
        gating_suite, metric = split_metric(self.gating_metric, suites)
        return list(dict.fromkeys([*self.guard, *(f"{s}/{metric.name}" for s in suites if s != gating_suite)]))
