"""The promotion gate: does the challenger beat the champion by more than sampling noise?

Both models are scored on the same eval items (the challenger's eval; the champion's per-item scores logged with
its run, or a fresh evaluation of the champion on this eval set when it was scored on a different one or with
different settings). The difference in the gating metric is resampled item by item (paired bootstrap, Efron &
Tibshirani 1993, ch. 13; `tasks.metrics.paired_bootstrap_ci`), and the challenger is promoted only when the lower
bound of its 95% interval is above `registry.min_delta`. The first version of a model is the champion.

A GRPO round that raised a training-health alarm (tasks/health.py) is registered as challenger only, whatever the
comparison says, unless `registry.allow_unhealthy`: a score that rose while the policy collapsed or the loss went
NaN is not one to serve.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.common import Ref, logger
from grpo_pipeline.tasks.evaluate import ITEMS_FILE, EvalResult, evaluate_model
from grpo_pipeline.tasks.health import alarm_kinds
from grpo_pipeline.tasks.metrics import paired_bootstrap_ci
from grpo_pipeline.tasks.stage import RunContext

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

ITEMS_ARTIFACT = f"eval/{ITEMS_FILE}"
TAG = "gate."


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
    # The training-health clause ("" for a healthy round) and whether it alone kept the version from champion.
    health: str = ""
    held_back: bool = False

    @property
    def decision(self) -> str:
        if self.held_back:
            return "unhealthy"
        if self.champion_version is None:
            return "first"
        return "promoted" if self.promote else "kept champion"

    def tags(self) -> dict[str, str]:
        values = self.model_dump(exclude_none=True)
        return {f"{TAG}decision": self.decision, **{f"{TAG}{k}": str(v) for k, v in values.items()}}

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> GateDecision:
        fields = {k.removeprefix(TAG): v for k, v in tags.items() if k.startswith(TAG) and k != f"{TAG}decision"}
        fields["promote"] = fields.get("promote") == "True"
        fields["held_back"] = fields.get("held_back") == "True"
        return cls.model_validate(fields)

    def explain(self) -> str:
        if self.champion_version is None:
            first = f"first version, {self.metric} {self.challenger:.4f} on {self.n} items"
            return f"{first}; {self.health}" if self.health else first
        return (
            f"{self.metric} {self.challenger:.4f} vs champion v{self.champion_version} {self.champion:.4f} on the same "
            f"{self.n} items: difference {self.delta:+.4f}, 95% CI [{self.ci_low:+.4f}, {self.ci_high:+.4f}]; "
            f"{self.reason}"
        )


def item_metric(items: pd.DataFrame, metric: str) -> pd.Series:
    """The gating metric per eval item, indexed by item id: `accuracy` (greedy correct), `pass_at_<k>`,
    `maj_at_<k>` or `reward/<name>` (the item's mean reward)."""
    if metric == "accuracy":
        values = items["greedy_correct"].astype(float)
    elif metric.startswith(("pass_at_", "maj_at_")):
        kind, k = metric.rsplit("_", 1)  # pass_at_4 -> the column pass_at_k, key "4"
        values = items[f"{kind}_k"].map(lambda d: d.get(k) if isinstance(d, dict) else None)
    elif metric.startswith("reward/"):
        values = items["reward_means"].map(lambda d: d.get(metric.removeprefix("reward/")))
    else:
        raise ValueError(f"no per-item scores for gating metric {metric!r}")
    return pd.Series(values.to_numpy(dtype=float), index=items["id"], name=metric)


def decide(
    client: MlflowClient,
    cfg: RegistryConfig,
    result: EvalResult,
    items: pd.DataFrame,
    ctx: RunContext,
    alarms: Sequence[str] = (),
) -> GateDecision:
    """Compare `result` (the challenger, with its per-item scores `items`) with the current champion of
    `cfg.model_name` on the same items; `alarms` (the round's training-health alarms) hold it back from champion
    unless `cfg.allow_unhealthy`."""
    return health_rule(_compare(client, cfg, result, items, ctx), alarms, cfg)


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
    from mlflow.exceptions import MlflowException

    challenger = item_metric(items, cfg.gating_metric)
    base = {"metric": cfg.gating_metric, "challenger": float(challenger.mean()), "min_delta": cfg.min_delta}
    try:
        champion = client.get_model_version_by_alias(cfg.model_name, "champion")
    except MlflowException:
        return GateDecision(**base, promote=True, reason="first version", n=len(challenger))
    theirs = item_metric(champion_items(client, champion, result, ctx), cfg.gating_metric).reindex(challenger.index)
    if theirs.isna().any():
        raise ValueError(f"champion v{champion.version} has no {cfg.gating_metric} for some eval items")
    delta, low, high = paired_bootstrap_ci(theirs.tolist(), challenger.tolist(), seed=ctx.seed)
    promote = low > cfg.min_delta
    reason = f"the CI's lower bound is {'' if promote else 'not '}above min_delta {cfg.min_delta}"
    return GateDecision(
        **base,
        promote=promote,
        reason=reason,
        n=len(challenger),
        champion=float(theirs.mean()),
        champion_version=str(champion.version),
        delta=delta,
        ci_low=low,
        ci_high=high,
    )


def champion_items(client: MlflowClient, champion: ModelVersion, result: EvalResult, ctx: RunContext) -> pd.DataFrame:
    """The champion's per-item scores on `result`'s eval set with `result`'s settings: the ones logged with its run
    when they match, else a fresh evaluation of the champion (kept under the run directory)."""
    settings = {k: str(v) for k, v in result.settings().items()}
    if all(champion.tags.get(k) == v for k, v in settings.items()):
        logged = _logged_items(champion.run_id)
        if logged is not None:
            return logged
    from grpo_pipeline.tasks.model import fetch_registered

    logger.info(
        "scoring champion v%s on this eval set (it was scored on another or with other settings)", champion.version
    )
    scratch = Path(ctx.run_dir).resolve() / "champion" / f"{champion.name}-v{champion.version}"
    model_dir = fetch_registered(champion, ctx.run_dir, scratch / "model")
    rescored = evaluate_model(
        str(model_dir),
        Ref(path=result.eval_path, fingerprint=result.eval_fingerprint),
        result.config,
        seed=result.seed,
        out=scratch / f"eval-{result.eval_fingerprint[:12]}",
        rewards=result.rewards,
        label=f"champion v{champion.version}",
    )
    return rescored.items()


def _logged_items(run_id: str) -> pd.DataFrame | None:
    import mlflow
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=ITEMS_ARTIFACT, dst_path=tmp)
        except (MlflowException, OSError):
            return None
        return pd.read_json(path, lines=True, dtype=False)
