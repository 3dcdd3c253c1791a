"""Stage 6, register: log the policy and its scores to MLflow, register a model version, gate the aliases.

Gating: the new version takes the alias `champion` only if its gating metric beats the current champion's by more
than `min_improvement`; otherwise it is the `challenger`. Everything that can fail (files, metrics) is checked and
logged *before* the registry is touched, and a version whose aliasing fails is deleted, so a failed registration
leaves no partial version behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.common import Checkpoint, logger
from grpo_pipeline.tasks.curves import CURVE_ARTIFACT, PROBE_METRIC, learning_curve_figure, metric_history
from grpo_pipeline.tasks.evaluate import EvalResult
from grpo_pipeline.tasks.stage import RunContext, stage
from grpo_pipeline.tasks.tracking import configure_mlflow

if TYPE_CHECKING:  # mlflow loads when a version is registered, not when the flow is imported
    from mlflow import MlflowClient

GATING_TAG = "gating_value"


class Registration(BaseModel):
    model_name: str
    version: str
    alias: str
    gating_metric: str
    gating_value: float
    previous_champion: str | None
    previous_champion_value: float | None
    run_id: str


def _metric(result: EvalResult, name: str) -> float:
    metrics = result.metrics()
    if name not in metrics:
        raise ValueError(f"registry.gating_metric {name!r} is not an eval metric; choose one of {sorted(metrics)}")
    return metrics[name]


def _current_champion(client: MlflowClient, name: str) -> tuple[str | None, float | None]:
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None, None
    value = version.tags.get(GATING_TAG)
    return str(version.version), float(value) if value is not None else None


def _log_learning_curve(
    client: MlflowClient, policy: Checkpoint, result: EvalResult, baseline: EvalResult | None
) -> None:
    """The reward curve (sampled reward, sampled accuracy, held-out probe per step) with the SFT baseline line."""
    import matplotlib.pyplot as plt
    import mlflow

    history = metric_history(client, policy.run_id, ["reward", "rewards/correctness/mean", PROBE_METRIC])
    fig = learning_curve_figure(
        history,
        sft_accuracy=baseline.accuracy if baseline is not None else None,
        final_accuracy=result.accuracy,
        title=f"{policy.stage}: held-out greedy accuracy {result.accuracy:.3f}"
        + (f" (SFT {baseline.accuracy:.3f})" if baseline is not None else ""),
    )
    mlflow.log_figure(fig, CURVE_ARTIFACT)
    plt.close(fig)


# The resolved config and the tags are logged, not keyed: a new version is registered only when the policy, its
# scores or the registry settings change.
@stage("register", unkeyed=("config_yaml", "tags"))
def register_policy(
    policy: Checkpoint,
    result: EvalResult,
    baseline: EvalResult | None,
    cfg: RegistryConfig,
    ctx: RunContext,
    config_yaml: str,
    tags: dict[str, str],
) -> Registration:
    """Log metrics, config and model files to the policy's MLflow run and register a new version."""
    from mlflow import MlflowClient

    if policy.run_id is None:
        raise ValueError("only a trained policy (with an MLflow run) can be registered")
    value = _metric(result, cfg.gating_metric)
    path = policy.require()
    configure_mlflow(ctx.run_dir, cfg.experiment)
    client = MlflowClient()
    source = _log_policy_run(client, policy, path, result, baseline, config_yaml, tags)
    return _create_gated_version(client, cfg, policy.run_id, source, value, tags)


def _log_policy_run(
    client: MlflowClient,
    policy: Checkpoint,
    path: Path,
    result: EvalResult,
    baseline: EvalResult | None,
    config_yaml: str,
    tags: dict[str, str],
) -> str:
    """Scores, eval settings, config, eval details, learning curve and model files on the policy's run; returns
    the model's artifact URI."""
    import mlflow

    with mlflow.start_run(run_id=policy.run_id):
        mlflow.log_metrics(result.metrics("eval/"))
        if baseline is not None:
            mlflow.log_metrics(baseline.metrics("eval_sft/"))
        mlflow.log_params(
            {
                "eval_n_samples": result.n_samples,
                "eval_temperature": result.temperature,
                "eval_top_p": result.top_p,
                "eval_max_new_tokens": result.max_new_tokens,
                "eval_num_problems": result.num_problems,
            }
        )
        mlflow.log_text(config_yaml, "config.yaml")
        mlflow.log_artifact(result.details_path, "eval")
        _log_learning_curve(client, policy, result, baseline)
        mlflow.set_tags(tags)
        mlflow.log_artifacts(str(path), "model")
        return mlflow.get_artifact_uri("model")


def _create_gated_version(
    client: MlflowClient, cfg: RegistryConfig, run_id: str, source: str, value: float, tags: dict[str, str]
) -> Registration:
    """A new version of `cfg.model_name` that takes `champion` if it beats the current one, else `challenger`."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(cfg.model_name)
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    previous, previous_value = _current_champion(client, cfg.model_name)
    mv = client.create_model_version(
        cfg.model_name, source=source, run_id=run_id, tags={**tags, GATING_TAG: str(value)}
    )
    try:
        wins = previous_value is None or value > previous_value + cfg.min_improvement
        registration = Registration(
            model_name=cfg.model_name,
            version=str(mv.version),
            alias="champion" if wins else "challenger",
            gating_metric=cfg.gating_metric,
            gating_value=value,
            previous_champion=previous,
            previous_champion_value=previous_value,
            run_id=run_id,
        )
        client.set_registered_model_alias(cfg.model_name, registration.alias, mv.version)
    except BaseException:
        # No half-registered versions: a version without its alias would confuse the next gating decision.
        client.delete_model_version(cfg.model_name, mv.version)
        raise
    logger.info(
        "registered %s version %s as %s (%s %.4f vs champion %s)",
        cfg.model_name,
        mv.version,
        registration.alias,
        cfg.gating_metric,
        value,
        previous_value,
    )
    return registration
