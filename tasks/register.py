"""Stage 6, register: log the policy as an MLflow model with its scores, register a version, gate the aliases.

The gate (`gate.py`) compares the new version with the current champion item by item on the same eval set and
promotes it only when the paired bootstrap CI of the difference clears `registry.min_delta`; otherwise it is the
`challenger`. Everything that can fail (files, metrics, the champion's scores) is checked and logged *before* the
registry is touched, a version whose aliasing fails is deleted, and a run that already has a version is not
registered again, so a retried or repeated registration leaves exactly one version.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.card import model_card
from grpo_pipeline.tasks.common import Checkpoint, logger
from grpo_pipeline.tasks.curves import CURVE_ARTIFACT, PROBE_METRIC, learning_curve_figure, metric_history
from grpo_pipeline.tasks.evaluate import EvalResult
from grpo_pipeline.tasks.gate import ITEMS_ARTIFACT, GateDecision, decide
from grpo_pipeline.tasks.health import health_tags
from grpo_pipeline.tasks.lineage import provenance_tags
from grpo_pipeline.tasks.stage import RunContext, stage
from grpo_pipeline.tasks.tracking import configure_mlflow

if TYPE_CHECKING:  # mlflow loads when a version is registered, not when the flow is imported
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.models.model import ModelInfo

COMPLETIONS_TABLE = "eval/completions.json"


class Registration(BaseModel):
    model_name: str
    version: str
    alias: str
    run_id: str
    model_uri: str
    gate: GateDecision
    # True when this run was registered before (a retry or a rerun): the existing version is returned as it is.
    existing: bool = False

    @property
    def gating_metric(self) -> str:
        return self.gate.metric

    @property
    def gating_value(self) -> float:
        return self.gate.challenger


def _metric(result: EvalResult, name: str) -> float:
    metrics = result.metrics()
    if name not in metrics:
        raise ValueError(f"registry.gating_metric {name!r} is not an eval metric; choose one of {sorted(metrics)}")
    return metrics[name]


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
    """Log scores, config and the model (an MLflow transformers model) to the policy's run, and register a version
    of `cfg.model_name` that takes `champion` only if the gate promotes it."""
    from mlflow import MlflowClient

    if policy.run_id is None:
        raise ValueError("only a trained policy (with an MLflow run) can be registered")
    _metric(result, cfg.gating_metric)
    path = policy.require()
    configure_mlflow(ctx.run_dir, cfg.experiment)
    client = MlflowClient()
    existing = _version_of_run(client, cfg.model_name, policy.run_id)
    if existing is not None:
        logger.info("run %s is version %s already; not registered again", policy.run_id, existing.version)
        return _registration_of(client, existing)
    items = result.items()
    gate = decide(client, cfg, result, items, ctx, alarms=policy.alarms)  # an unhealthy round: challenger only
    tags = {**tags, **provenance_tags(result), **health_tags(policy.alarms), **gate.tags()}
    card = model_card(cfg, policy, result, baseline, gate, tags, config_yaml, prompt=str(items["prompt"].iloc[0]))
    info = _log_policy_run(client, policy, path, result, items, baseline, config_yaml, tags, card)
    return _create_gated_version(client, cfg, policy.run_id, info, gate, tags, card)


def _version_of_run(client: MlflowClient, name: str, run_id: str) -> ModelVersion | None:
    found = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    return min(found, key=lambda v: int(v.version)) if found else None


def _registration_of(client: MlflowClient, version: ModelVersion) -> Registration:
    """The Registration a version was created with (its gate tags), as it stands now."""
    current = client.get_model_version(version.name, version.version)
    return Registration(
        model_name=current.name,
        version=str(current.version),
        alias="champion" if "champion" in current.aliases else "challenger",
        run_id=current.run_id,
        model_uri=f"models:/{current.name}/{current.version}",
        gate=GateDecision.from_tags(current.tags),
        existing=True,
    )


def _log_policy_run(
    client: MlflowClient,
    policy: Checkpoint,
    path: Path,
    result: EvalResult,
    items: pd.DataFrame,
    baseline: EvalResult | None,
    config_yaml: str,
    tags: dict[str, str],
    card: str,
) -> ModelInfo:
    """Scores, eval settings, config, per-item scores, a completions table, the learning curve and the model (with
    its card) on the policy's run."""
    import mlflow

    with mlflow.start_run(run_id=policy.run_id):
        mlflow.log_metrics(result.metrics("eval/"))
        mlflow.log_metrics(
            {"eval/accuracy_ci_low": result.accuracy_ci[0], "eval/accuracy_ci_high": result.accuracy_ci[1]}
        )
        if baseline is not None:
            mlflow.log_metrics(baseline.metrics("eval_sft/"))
        mlflow.log_params(result.settings())
        mlflow.log_text(config_yaml, "config.yaml")
        mlflow.log_artifact(result.items_path, str(Path(ITEMS_ARTIFACT).parent))  # where the gate reads them
        mlflow.log_table(completions_table(items), artifact_file=COMPLETIONS_TABLE)
        _log_learning_curve(client, policy, result, baseline)
        mlflow.set_tags(tags)
        return log_transformers_model(path, card, result.max_new_tokens)


def completions_table(items: pd.DataFrame, max_items: int = 25) -> dict[str, list]:
    """A sample of eval items, one row per sampled completion: prompt, completion, correct, reward per function."""
    items = items.head(max_items)
    table: dict[str, list] = {"item": [], "prompt": [], "completion": [], "correct": []}
    names = (
        sorted({name for rewards in items["sample_rewards"] for name in rewards}) if "sample_rewards" in items else []
    )
    for name in names:
        table[f"reward/{name}"] = []
    for _, item in items.iterrows():
        for j, completion in enumerate(item["samples"]):
            table["item"].append(item["id"])
            table["prompt"].append(str(item["prompt"]))
            table["completion"].append(completion)
            table["correct"].append(bool(item["sample_correct"][j]))
            for name in names:
                table[f"reward/{name}"].append(item["sample_rewards"][name][j])
    return table


def log_transformers_model(path: Path, card: str, max_new_tokens: int) -> ModelInfo:
    """The checkpoint as an MLflow transformers model (text generation, with its tokenizer, a signature, pinned
    requirements and the model card), so `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model` work on
    its registered versions and `mlflow models serve` can serve them."""
    import mlflow
    from huggingface_hub import ModelCard
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.tasks.training import load_tokenizer

    signature = ModelSignature(
        inputs=Schema([ColSpec(DataType.string)]),
        outputs=Schema([ColSpec(DataType.string)]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", DataType.long, max_new_tokens),
                ParamSpec("do_sample", DataType.boolean, False),
                ParamSpec("temperature", DataType.double, 1.0),
                ParamSpec("top_p", DataType.double, 1.0),
            ]
        ),
    )
    components = {"model": AutoModelForCausalLM.from_pretrained(path), "tokenizer": load_tokenizer(str(path))}
    with tempfile.TemporaryDirectory() as tmp:
        info = mlflow.transformers.log_model(
            transformers_model=components,
            name="model",
            task="text-generation",
            signature=signature,
            pip_requirements=pinned_requirements(),
            # Hugging Face's card format wants a metadata block; the card itself is also README.md (below).
            model_card=ModelCard(f"---\nlibrary_name: transformers\ntags: [grpo, grpo-pipeline]\n---\n{card}"),
            metadata={"source_checkpoint": path.name},
        )
        readme = Path(tmp) / "README.md"
        readme.write_text(card)
        mlflow.MlflowClient().log_model_artifact(info.model_id, str(readme))
    return info


def pinned_requirements() -> list[str]:
    """What loading the model needs, pinned to the versions it was saved with (no slow inference by MLflow)."""
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in ("mlflow", "transformers", "tokenizers", "safetensors")]
    return [*pins, f"torch=={version('torch').split('+')[0]}"]


def _create_gated_version(
    client: MlflowClient,
    cfg: RegistryConfig,
    run_id: str,
    info: ModelInfo,
    gate: GateDecision,
    tags: dict[str, str],
    card: str,
) -> Registration:
    """A new version of `cfg.model_name` that takes `champion` when the gate promotes it, else `challenger`."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(cfg.model_name)
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    mv = client.create_model_version(
        cfg.model_name, source=info.model_uri, run_id=run_id, tags=tags, description=card, model_id=info.model_id
    )
    try:
        registration = Registration(
            model_name=cfg.model_name,
            version=str(mv.version),
            alias="champion" if gate.promote else "challenger",
            run_id=run_id,
            model_uri=f"models:/{cfg.model_name}/{mv.version}",
            gate=gate,
        )
        client.set_registered_model_alias(cfg.model_name, registration.alias, mv.version)
    except BaseException:
        # No half-registered versions: a version without its alias would confuse the next gating decision.
        client.delete_model_version(cfg.model_name, mv.version)
        raise
    logger.info("registered %s version %s as %s: %s", cfg.model_name, mv.version, registration.alias, gate.explain())
    return registration
