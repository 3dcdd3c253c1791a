"""The promotion gate: does the challenger beat the champion by more than sampling noise?

Both models are scored on the same eval items (the challenger's eval; the champion's per-item scores logged with its
run, or a fresh evaluation of the champion on this eval set when it was scored on a different one or with different
settings: tasks/release/champion.py looks them up). The difference in the gating metric is resampled item by item
(paired bootstrap, Efron & Tibshirani 1993, ch. 13; `tasks.scoring.metrics.paired_bootstrap_ci`), and the challenger is
promoted only when the lower bound of its 95% interval is above `registry.min_delta`. The first version of a model is
the champion.

The gate decides only on evidence. An item whose gating metric is unscored on either side (None or NaN in items.jsonl,
or no such column or key) is left out of the pairs, and the decision records how many were used (`n`) and left out
(`n_excluded`). A challenger that cannot be scored (fewer than MIN_SCORED_ITEMS items left, or more than
MAX_UNSCORED_SHARE of them unscored) is `unscored`: registered as challenger only, never compared on what is left.
Only MLflow's answer that the model or its `champion` alias does not exist means "no champion yet"; any other error
(a server error, a refused permission) propagates, and the register stage retries it.

Guarded metrics (`registry.guard`, other suites' metrics) make the promotion a two-part test: the gating metric's CI
must say better (as above), and each guarded metric's paired CI lower bound must be above `-registry.guard_margin`
(non-inferiority: GRPO on one task may not cost more than the margin on another). A guard that cannot be compared
(too few items scored on both sides) blocks the promotion; with no champion there is nothing to guard against.

A GRPO round that raised a training-health alarm (tasks/training/health.py) is registered challenger only, whatever the
comparison says, unless `registry.allow_unhealthy`: a score that rose while the policy collapsed or the loss went
NaN is not one to serve.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.configs.schema import Metric, RegistryConfig, split_metric
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.release.champion import champion_items, current_champion
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.training.monitor import alarm_kinds

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

TAG = "gate."
# A paired bootstrap on a handful of items gives a percentile interval that is too narrow to mean anything (it
# undercovers for small n; Efron & Tibshirani 1993, ch. 13): fewer scored items than this decide nothing.
MIN_SCORED_ITEMS = 10
# Unscored items are not missing at random (a reward that fails, fails on some completions and not on others), so
# what remains speaks for the eval set only while the share left out is small.
MAX_UNSCORED_SHARE = 0.2


class GuardCheck(BaseModel):
    """One guarded metric against the champion: the paired difference and whether it is within the margin."""

    metric: str
    passed: bool
    reason: str
    margin: float
    challenger: float | None = None
    champion: float | None = None
    n: int = 0
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None

    def explain(self) -> str:
        if self.delta is None:
            return f"guard {self.metric}: {self.reason}"
        return (
            f"guard {self.metric} {self.challenger:.4f} vs {self.champion:.4f} on {self.n} items: difference "
            f"{self.delta:+.4f}, 95% CI [{self.ci_low:+.4f}, {self.ci_high:+.4f}]; {self.reason}"
        )


class GateDecision(BaseModel):
    """What the gate compared and what it decided; stored as `gate.*` tags on the version."""

    metric: str
    promote: bool
    reason: str
    challenger: float
    n: int
    min_delta: float
    champion: float | None = None
    champion_version: str | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    # Items left out of `n` because their gating metric was unscored for the challenger or the champion.
    n_excluded: int = 0
    # True when too few items were scored to decide (the reason says how many): challenger only.
    unscored: bool = False
    # The training-health clause ("" for a healthy round) and whether it alone kept the version from champion.
    health: str = ""
    held_back: bool = False
    # The guarded metrics (registry.guard), and whether one of them alone kept the version from champion.
    guards: list[GuardCheck] = []
    guarded: bool = False

    @property
    def decision(self) -> str:
        if self.unscored:
            return "unscored"
        if self.held_back:
            return "unhealthy"
        if self.guarded:
            return "guarded"
        if self.champion_version is None:
            return "first"
        return "promoted" if self.promote else "kept champion"

    def tags(self) -> dict[str, str]:
        values = self.model_dump(exclude_none=True, exclude={"guards"})
        guards = {f"{TAG}guards": json.dumps([g.model_dump() for g in self.guards])} if self.guards else {}
        return {f"{TAG}decision": self.decision, **{f"{TAG}{k}": str(v) for k, v in values.items()}, **guards}

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> GateDecision:
        fields: dict = {k.removeprefix(TAG): v for k, v in tags.items() if k.startswith(TAG) and k != f"{TAG}decision"}
        for flag in ("promote", "held_back", "unscored", "guarded"):
            fields[flag] = fields.get(flag) == "True"
        fields["guards"] = json.loads(fields.get("guards", "[]"))
        return cls.model_validate(fields)

    def explain(self) -> str:
        if self.unscored:
            return f"{self.metric} not compared: {self.reason}"
        left_out = f" ({self.n_excluded} unscored left out)" if self.n_excluded else ""
        if self.champion_version is None:
            first = f"first version, {self.metric} {self.challenger:.4f} on {self.n} items{left_out}"
            return f"{first}; {self.health}" if self.health else first
        return (
            f"{self.metric} {self.challenger:.4f} vs champion v{self.champion_version} {self.champion:.4f} on the same "
            f"{self.n} items{left_out}: difference {self.delta:+.4f}, 95% CI [{self.ci_low:+.4f}, "
            f"{self.ci_high:+.4f}]; {self.reason}"
        )

    def guard_lines(self) -> list[str]:
        """One line per guarded metric (none without guards)."""
        return [g.explain() for g in self.guards]


def item_metric(items: pd.DataFrame, metric: Metric | str) -> pd.Series:
    """The gating metric per eval item, indexed by item id: `accuracy` (greedy correct), `pass_at_<k>`,
    `maj_at_<k>` or `reward/<name>` (the item's mean reward; configs/metrics.py). An unscored item (None or NaN, or
    no such column or key in its row) is NaN. A name outside that grammar raises ValueError."""
    metric = Metric.parse(metric) if isinstance(metric, str) else metric

    def column(name: str) -> pd.Series:
        return items[name] if name in items else pd.Series(None, index=items.index, dtype=object)

    def key(name: str, k: str) -> pd.Series:
        return column(name).map(lambda d: d.get(k) if isinstance(d, dict) else None)

    if metric.kind == "accuracy":
        values = column("greedy_correct")
    elif metric.kind == "reward":
        values = key("reward_means", str(metric.reward))
    else:  # pass_at_4 -> the column pass_at_k, key "4"
        values = key(f"{metric.kind}_k", str(metric.k))
    return pd.Series(values.to_numpy(dtype=float, na_value=np.nan), index=items["id"], name=metric.name)


def decide(
    client: MlflowClient,
    cfg: RegistryConfig,
    result: EvalResult,
    items: pd.DataFrame,
    ctx: RunContext,
    alarms: Sequence[str] = (),
    suites: Mapping[str, EvalResult] | None = None,
) -> GateDecision:
    """Compare `result` (the challenger, with its per-item scores `items`) with the current champion of
    `cfg.model_name` on the same items, and each guarded metric on its suite's items (`suites`, by name); `alarms`
    (the round's training-health alarms) hold it back from champion unless `cfg.allow_unhealthy`."""
    decision = _compare(client, cfg, result, items, ctx)
    suites = suites or {result.suite: result}
    if cfg.guarded(list(suites)):
        decision = guard_rule(decision, cfg, _guards(client, cfg, suites, ctx))
    return health_rule(decision, alarms, cfg)


def guard_rule(decision: GateDecision, cfg: RegistryConfig, guards: list[GuardCheck]) -> GateDecision:
    """A challenger the gating metric promotes stays challenger when a guarded metric regressed past the margin."""
    failed = [g for g in guards if not g.passed]
    if not (decision.promote and failed):
        return decision.model_copy(update={"guards": guards})
    why = "; ".join(f"{g.metric} {g.reason}" for g in failed)
    reason = f"{decision.reason}, but a guarded metric may have regressed ({why}), so it is registered as challenger"
    return decision.model_copy(update={"guards": guards, "promote": False, "guarded": True, "reason": reason})


def _guards(
    client: MlflowClient, cfg: RegistryConfig, suites: Mapping[str, EvalResult], ctx: RunContext
) -> list[GuardCheck]:
    """Each guarded metric of the challenger against the current champion on the same items of its suite."""
    champion = current_champion(client, cfg.model_name)
    names = list(suites)
    checks = []
    for metric in cfg.guarded(names):
        suite, bare = split_metric(metric, names)  # the config check has named every suite a guard reads
        checks.append(_guard(client, champion, metric, bare, suites[suite], cfg.guard_margin, ctx))
    return checks


def _guard(
    client: MlflowClient,
    champion: ModelVersion | None,
    metric: str,
    bare: Metric,
    result: EvalResult,
    margin: float,
    ctx: RunContext,
) -> GuardCheck:
    ours = item_metric(result.items(), bare)
    if champion is None:
        return GuardCheck(metric=metric, passed=True, reason="no champion to compare with", margin=margin)
    theirs = item_metric(champion_items(client, champion, result, ctx), bare).reindex(ours.index)
    both = ours.notna() & theirs.notna()
    if int(both.sum()) < MIN_SCORED_ITEMS or int((~both).sum()) > MAX_UNSCORED_SHARE * len(ours):
        reason = f"could not be compared: {int(both.sum())} of {len(ours)} items scored for both"
        return GuardCheck(metric=metric, passed=False, reason=reason, margin=margin, n=int(both.sum()))
    delta, low, high = paired_bootstrap_ci(theirs[both].tolist(), ours[both].tolist(), seed=ctx.seed)
    passed = low > -margin
    reason = f"the CI's lower bound is {'' if passed else 'not '}above -guard_margin {-margin:g}"
    return GuardCheck(
        metric=metric, passed=passed, reason=reason, margin=margin, challenger=_mean(ours[both]),
        champion=_mean(theirs[both]), n=int(both.sum()), delta=delta, ci_low=low, ci_high=high,
    )  # fmt: skip


def health_rule(decision: GateDecision, alarms: Sequence[str], cfg: RegistryConfig) -> GateDecision:
    """A round with training-health alarms takes `champion` only with `registry.allow_unhealthy`; the reason says
    which alarms it raised and what they decided."""
    if not alarms:
        return decision
    raised = f"the round raised {len(alarms)} training-health alarm(s) ({', '.join(alarm_kinds(alarms))})"
    if cfg.allow_unhealthy:
        health = f"{raised}; registry.allow_unhealthy lets it take champion all the same"
        update = {"health": health}
    else:
        health = (
            f"{raised}, so it is registered as challenger only (registry.allow_unhealthy: true lets such a round "
            "take champion)"
        )
        update = {"health": health, "promote": False, "held_back": decision.promote}
    return decision.model_copy(update={**update, "reason": f"{decision.reason}; {health}"})


def _compare(
    client: MlflowClient, cfg: RegistryConfig, result: EvalResult, items: pd.DataFrame, ctx: RunContext
) -> GateDecision:
    """The statistical comparison alone (see the module's docstring)."""
    bare = split_metric(cfg.gating_metric, [result.suite])[1]  # `gsm8k_test/accuracy`: the gating suite's accuracy
    ours = item_metric(items, bare)
    base = {"metric": cfg.gating_metric, "min_delta": cfg.min_delta}
    champion = current_champion(client, cfg.model_name)
    if champion is None:
        scored = ours.notna()
        shortfall = _shortfall(ours, scored, "the challenger")
        if shortfall:
            return _unscored(base, ours, scored, shortfall)
        n, n_excluded = int(scored.sum()), int((~scored).sum())
        challenger = _mean(ours[scored])
        return GateDecision(
            **base, promote=True, reason="first version", challenger=challenger, n=n, n_excluded=n_excluded
        )
    theirs = item_metric(champion_items(client, champion, result, ctx), bare).reindex(ours.index)
    both = ours.notna() & theirs.notna()
    against = {"champion_version": str(champion.version), "champion": _mean(theirs[both])}
    shortfall = _shortfall(ours, both, f"both the challenger and champion v{champion.version}", theirs)
    if shortfall:
        return _unscored(base, ours, both, shortfall, **against)
    delta, low, high = paired_bootstrap_ci(theirs[both].tolist(), ours[both].tolist(), seed=ctx.seed)
    promote = low > cfg.min_delta
    reason = f"the CI's lower bound is {'' if promote else 'not '}above min_delta {cfg.min_delta}"
    return GateDecision(
        **base,
        promote=promote,
        reason=reason,
        challenger=_mean(ours[both]),
        n=int(both.sum()),
        n_excluded=int((~both).sum()),
        **against,
        delta=delta,
        ci_low=low,
        ci_high=high,
    )


def _shortfall(ours: pd.Series, used: pd.Series, whose: str, theirs: pd.Series | None = None) -> str:
    """Why the items in `used` (a mask over `ours`) are not enough to decide on, or "" when they are."""
    n, total = int(used.sum()), len(ours)
    if n >= MIN_SCORED_ITEMS and total - n <= MAX_UNSCORED_SHARE * total:
        return ""
    missing = f"{int(ours.isna().sum())} unscored for the challenger"
    if theirs is not None:
        missing += f", {int(theirs.isna().sum())} for the champion"
    return (
        f"only {n} of {total} items have a {ours.name} score for {whose} ({missing}); the gate needs at least "
        f"{MIN_SCORED_ITEMS} scored and at most {MAX_UNSCORED_SHARE:.0%} unscored, so it is registered as "
        "challenger only"
    )


def _unscored(base: dict, ours: pd.Series, used: pd.Series, reason: str, **against: object) -> GateDecision:
    return GateDecision(
        **base,
        promote=False,
        unscored=True,
        reason=reason,
        challenger=_mean(ours[used]),
        n=int(used.sum()),
        n_excluded=int((~used).sum()),
        **against,
    )


def _mean(values: pd.Series) -> float:
    """The mean of `values`, NaN (not a warning) when there are none."""
    return float(values.mean()) if len(values) else float("nan")
