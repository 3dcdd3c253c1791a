"""Stage 6, register: log the policy as an MLflow model with its scores, register a version, gate the aliases.

The gate (`gate.py`) compares the new version with the current champion item by item on the same eval set and
promotes it only when the paired bootstrap CI of the difference clears `registry.min_delta`; otherwise it is the
`challenger`. Everything that can fail (files, metrics, the champion's scores) is checked and logged *before* the
registry is touched, a version whose aliasing fails is deleted, and a run that already has a version is not
registered again, so a retried or repeated registration leaves exactly one version.

Registration is idempotent across a failure at any point, as when the tracking server goes away mid-way (the
register stage then retries, see flows/grpo_pipeline.py): a model already logged to the run from the same checkpoint
is reused rather than logged again, the completions table is logged once, a version created but left without its
alias (the server was gone before it could be set or the version deleted) is given the alias its gate decision
gives, and a second version of the same run (a create request retried by MLflow's HTTP client after the server had
committed the first) is deleted. That decision is the one its gate tags record only while the champion they name is
still the champion: when another run has promoted a version since, the version is compared again with the champion
of the moment, so an old comparison never takes `champion` from a version it was not compared with.

Gating one registered model is serialised (core/tracking.py registry_lock) from reading the champion to moving the
alias, across every run that shares the Prefect API (a global concurrency limit named after the model) and every run
that shares the run directory (a file lock).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.core.common import Checkpoint, logger
from grpo_pipeline.tasks.core.stage import RunContext, stage
from grpo_pipeline.tasks.core.tracking import configure_mlflow, registry_lock, require_reachable, tracking_uri
from grpo_pipeline.tasks.evaluate import EvalResult
from grpo_pipeline.tasks.release.card import model_card
from grpo_pipeline.tasks.release.gate import ITEMS_ARTIFACT, TAG, GateDecision, current_champion, decide
from grpo_pipeline.tasks.release.lineage import provenance_tags
from grpo_pipeline.tasks.scoring.curves import CURVE_ARTIFACT, PROBE_METRIC, learning_curve_figure, metric_history
from grpo_pipeline.tasks.training.health import health_tags

if TYPE_CHECKING:  # mlflow loads when a version is registered, not when the flow is imported
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.models.model import ModelInfo

COMPLETIONS_TABLE = "eval/completions.json"
# Set on a logged model once all of it (files and card) is stored: which checkpoint it holds, so a retry reuses it.
CHECKPOINT_TAG = "checkpoint_fingerprint"
# A version is tagged `registration: pending` from its creation until its alias is set, then `finished`: a retry
# finishes a pending version, and never touches a finished one (whose alias may since have moved to a newer version).
REGISTRATION_TAG, PENDING, FINISHED = "registration", "pending", "finished"


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
    require_reachable(tracking_uri(ctx.run_dir))  # fail in seconds, not after MLflow's own minutes of retries
    configure_mlflow(ctx.run_dir, cfg.experiment)
    client = MlflowClient()
    with registry_lock(ctx.run_dir, cfg.model_name):  # another run gating the same model waits its turn
        existing = _version_of_run(client, cfg.model_name, policy.run_id)

        def gated(items: pd.DataFrame) -> tuple[GateDecision, dict[str, str], str]:
            gate = decide(client, cfg, result, items, ctx, alarms=policy.alarms)  # unhealthy round: challenger only
            all_tags = {**tags, **provenance_tags(result), **health_tags(policy.alarms), **gate.tags()}
            prompt = str(items["prompt"].iloc[0])
            return gate, all_tags, model_card(cfg, policy, result, baseline, gate, all_tags, config_yaml, prompt=prompt)

        if existing is not None:
            logger.info("run %s is version %s already; not registered again", policy.run_id, existing.version)
            if _pending(existing) and not existing.aliases and _champion_moved(client, existing):
                gate, _, card = gated(result.items())
                existing = _regate(client, existing, gate, card)
            return _registration_of(client, _finished(client, existing))
        items = result.items()
        gate, tags, card = gated(items)
        model_id = _log_policy_run(client, policy, path, result, items, baseline, config_yaml, tags, card)
        return _create_gated_version(client, cfg, policy.run_id, model_id, gate, tags, card)


def _pending(version: ModelVersion) -> bool:
    return version.tags.get(REGISTRATION_TAG) == PENDING


def _version_of_run(client: MlflowClient, name: str, run_id: str) -> ModelVersion | None:
    """The run's version of `name`, finished ones first. Another version of the run whose registration never
    finished (a create request that MLflow's HTTP client sent twice) is deleted, so the run keeps exactly one."""
    found = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    if not found:
        return None
    versions = [client.get_model_version(name, v.version) for v in found]  # the search leaves out aliases
    keep = min(versions, key=lambda v: (_pending(v), not v.aliases, int(v.version)))
    for version in versions:
        if version.version != keep.version and _pending(version):
            logger.warning("run %s has a second version of %s (%s): deleting it", run_id, name, version.version)
            client.delete_model_version(name, version.version)
    return keep


def _champion_moved(client: MlflowClient, version: ModelVersion) -> bool:
    """Whether `champion` is on another version (or none) than the one `version`'s gate tags were compared with."""
    champion = current_champion(client, version.name)
    now = None if champion is None else str(champion.version)
    recorded = GateDecision.from_tags(version.tags).champion_version
    if now != recorded:
        logger.warning("version %s of %s was gated against champion %s, but the champion is now %s: comparing again",
                       version.version, version.name, recorded or "(none)", now or "(none)")  # fmt: skip
    return now != recorded


def _regate(client: MlflowClient, version: ModelVersion, gate: GateDecision, card: str) -> ModelVersion:
    """`version`'s gate tags (on the version and on its run) and card replaced by `gate`, a comparison with the current
    champion. The champion's version is written last: a retry interrupted half-way finds the old one and compares
    again."""
    new, last = gate.tags(), f"{TAG}champion_version"
    client.update_model_version(version.name, version.version, description=card)
    for key, value in new.items():
        if key != last:
            client.set_model_version_tag(version.name, version.version, key, value)
            client.set_tag(version.run_id, key, value)
    for key in [k for k in version.tags if k.startswith(TAG) and k not in new and k != last]:
        _delete_gate_tag(client, version, key)
    if last in new:
        client.set_tag(version.run_id, last, new[last])
        client.set_model_version_tag(version.name, version.version, last, new[last])
    elif last in version.tags:
        _delete_gate_tag(client, version, last)
    return client.get_model_version(version.name, version.version)


def _delete_gate_tag(client: MlflowClient, version: ModelVersion, key: str) -> None:
    """A gate tag the new decision does not have, off the run (if still there) and then off the version."""
    from mlflow.exceptions import MlflowException

    try:
        client.delete_tag(version.run_id, key)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    client.delete_model_version_tag(version.name, version.version, key)


def _finished(client: MlflowClient, version: ModelVersion) -> ModelVersion:
    """A version whose registration was interrupted, given the alias its gate tags decide (if it has none yet) and
    marked finished. A finished version is left as it is, even one whose alias has moved on to a newer version."""
    if not _pending(version):
        return version
    if not version.aliases:
        alias = "champion" if GateDecision.from_tags(version.tags).promote else "challenger"
        logger.warning("version %s of %s has no alias (its registration was interrupted): setting %s",
                       version.version, version.name, alias)  # fmt: skip
        client.set_registered_model_alias(version.name, alias, version.version)
    client.set_model_version_tag(version.name, version.version, REGISTRATION_TAG, FINISHED)
    return client.get_model_version(version.name, version.version)


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
) -> str:
    """Scores, eval settings, config, per-item scores, a completions table, the learning curve and the model (with
    its card) on the policy's run; returns the logged model's id.

    Safe to repeat on the same run: files and tags are overwritten, metrics get one more point, and the table and the
    model are logged only when the run does not hold them yet (`log_table` would append the rows again)."""
    import mlflow

    with mlflow.start_run(run_id=policy.run_id):
        mlflow.log_metrics(result.metrics("eval/"))
        mlflow.log_metrics({f"eval/unscored/{metric}": n for metric, n in result.unscored.items()})
        mlflow.log_metrics(
            {"eval/accuracy_ci_low": result.accuracy_ci[0], "eval/accuracy_ci_high": result.accuracy_ci[1]}
        )
        if baseline is not None:
            mlflow.log_metrics(baseline.metrics("eval_sft/"))
        mlflow.log_params(result.settings())
        mlflow.log_text(config_yaml, "config.yaml")
        mlflow.log_artifact(result.items_path, str(Path(ITEMS_ARTIFACT).parent))  # where the gate reads them
        logged = {a.path for a in client.list_artifacts(policy.run_id, str(Path(COMPLETIONS_TABLE).parent))}
        if COMPLETIONS_TABLE not in logged:
            mlflow.log_table(completions_table(items), artifact_file=COMPLETIONS_TABLE)
        _log_learning_curve(client, policy, result, baseline)
        mlflow.set_tags(tags)
        model_id = _logged_model_of(client, policy)
        if model_id is not None:
            logger.info("run %s holds this checkpoint's model already (%s): not logged again", policy.run_id, model_id)
            return model_id
        model_id = log_transformers_model(path, card, result.max_new_tokens).model_id
        client.set_logged_model_tags(model_id, {CHECKPOINT_TAG: policy.fingerprint})  # complete: a retry may reuse it
        return model_id


def _logged_model_of(client: MlflowClient, policy: Checkpoint) -> str | None:
    """A model that an earlier, interrupted registration logged to the policy's run, whole, from this checkpoint."""
    from mlflow.entities import LoggedModelStatus

    experiment = client.get_run(policy.run_id).info.experiment_id
    query = f"source_run_id = '{policy.run_id}' AND tags.{CHECKPOINT_TAG} = '{policy.fingerprint}'"
    found = client.search_logged_models([experiment], filter_string=query)
    return next((m.model_id for m in found if m.status == LoggedModelStatus.READY), None)


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
            ok = item["sample_correct"][j]
            table["correct"].append(None if ok is None else bool(ok))  # None: unscored
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

    from grpo_pipeline.tasks.training.trainer import load_tokenizer

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
    model_id: str,
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
        cfg.model_name,
        source=f"models:/{model_id}",
        run_id=run_id,
        tags={**tags, REGISTRATION_TAG: PENDING},
        description=card,
        model_id=model_id,
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
    except BaseException as e:
        # No half-registered versions: a version without its alias would confuse the next gating decision. When the
        # server is gone the version cannot be deleted either; the retry then finds it and sets its alias.
        try:
            client.delete_model_version(cfg.model_name, mv.version)
        except Exception as cleanup:
            logger.warning("version %s of %s kept without an alias (%s); a retry will set it", mv.version,
                           cfg.model_name, cleanup)  # fmt: skip
            raise e from None
        raise
    client.set_model_version_tag(cfg.model_name, mv.version, REGISTRATION_TAG, FINISHED)
    logger.info("registered %s version %s as %s: %s", cfg.model_name, mv.version, registration.alias, gate.explain())
    return registration
