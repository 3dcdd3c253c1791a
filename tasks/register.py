"""Stage 6, register: log the policy as an MLflow model with its scores, register a version, gate the aliases.

The gate (`gate.py`) compares the new version with the current champion item by item on the same eval set and
promotes it only when the paired bootstrap CI of the difference clears `registry.min_delta`; otherwise it is the
`challenger`. Everything that can fail (files, metrics, the champion's scores) is checked and logged *before* the
registry is touched, a version whose aliasing fails is deleted, and a run that already has a version is not
registered again, so a retried or repeated registration leaves exactly one version.

Registration is idempotent across a failure at any point, as when the tracking server goes away mid-way (the
register stage then retries, see flows/stages.py): a model already logged to the run from the same checkpoint
is reused rather than logged again, the completions table is logged once, a version created but left without its
alias (the server was gone before it could be set or the version deleted) is given the alias its gate decision
gives, and a second version of the same run (a create request retried by MLflow's HTTP client after the server had
committed the first) is deleted. That decision is the one its gate tags record only while the champion they name is
still the champion: when another run has promoted a version since, the version is compared again with the champion
of the moment, so an old comparison never takes `champion` from a version it was not compared with.

Gating one registered model is serialised (core/tracking.py registry_lock) from reading the champion to moving the
alias, across every run that shares the Prefect API (a global concurrency limit named after the model) and every run
that shares the run directory (a file lock).

A registration lives in one tracking store: the stage's key covers the store's address (`tracking_uri`), and a
cached registration is reused only while its version is still in that store (`StoredRegistration.remote_problems`,
which the flow checks as it checks cached files), so a rerun pointed at another store, or after the version was
deleted, registers again. A policy trained against another store (its round cached from a run before the change)
has no run in this one: it is registered from a run created here for it, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import RegistryConfig, split_metric
from grpo_pipeline.tasks.core.common import Checkpoint, load_tokenizer, logger
from grpo_pipeline.tasks.core.stage import RunContext, stage
from grpo_pipeline.tasks.core.tracking import (
    TrackingUnavailable,
    configure_mlflow,
    registry_lock,
    require_reachable,
    tracking_uri,
)
from grpo_pipeline.tasks.release.card import model_card, trained_tools
from grpo_pipeline.tasks.release.champion import ITEMS_ARTIFACT, suite_items_artifact, suite_tags
from grpo_pipeline.tasks.release.gate import GateDecision, decide
from grpo_pipeline.tasks.release.lineage import provenance_tags
from grpo_pipeline.tasks.scoring.curves import CURVE_ARTIFACT, PROBE_METRIC, learning_curve_figure, metric_history
from grpo_pipeline.tasks.scoring.matrix import StageRow
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.training.monitor import health_tags

if TYPE_CHECKING:  # mlflow loads when a version is registered, not when the flow is imported
    import pandas as pd
    from mlflow import MlflowClient

from grpo_pipeline.tasks.release.logged_model import (
    CHECKPOINT_TAG,
    COMPLETIONS_TABLE,
    completions_table,
    log_transformers_model,
    logged_model_of,
)
from grpo_pipeline.tasks.release.versions import (
    Registration,
    champion_moved,
    create_gated_version,
    finished,
    pending,
    regate,
    registration_of,
    version_of_run,
)

# On a run created to register a policy trained against another tracking store: the id of its training run there.
TRAINED_IN_TAG = "grpo_pipeline.trained_in_run"


class StoredRegistration(Registration):
    """A registration and the run directory whose tracking store holds it (`tracking_uri(run_dir)`: the store the
    register stage's key names, so the one a cached result is checked against)."""

    run_dir: str

    def remote_problems(self) -> list[str]:
        """What is wrong with the registered version in its tracking store: gone (the store was replaced, the version
        deleted), another run's, or not to be checked now (the server does not answer). Empty when it is there."""
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        uri = tracking_uri(self.run_dir)
        try:
            require_reachable(uri)
            version = MlflowClient(tracking_uri=uri).get_model_version(self.model_name, self.version)
        except TrackingUnavailable as e:
            return [f"{self.model_uri} cannot be checked: {e}"]
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return [f"{self.model_uri} is not in the MLflow registry at {uri}"]
            return [f"{self.model_uri} cannot be read from the MLflow registry at {uri} ({e.error_code})"]
        if version.run_id != self.run_id:
            return [f"{self.model_uri} at {uri} was registered from run {version.run_id}, not {self.run_id}"]
        return []


def _stored(registration: Registration, ctx: RunContext) -> StoredRegistration:
    return StoredRegistration(**dict(registration), run_dir=ctx.run_dir)


def _tracking_store(params: Mapping[str, Any]) -> dict[str, str]:
    """The tracking store a registration is made in: part of the register stage's key."""
    return {"tracking_uri": tracking_uri(params["ctx"].run_dir)}


def _run_in_this_store(client: MlflowClient, policy: Checkpoint, experiment_id: str) -> Checkpoint:
    """`policy` with a run in the current tracking store to register it from: its training run, or, when it was
    trained against another store (the round was cached before MLFLOW_TRACKING_URI changed), a run made here for it
    the first time and found again by its tag on a retry or rerun."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(policy.run_id)
        return policy
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    query = f"tags.`{TRAINED_IN_TAG}` = '{policy.run_id}'"
    found = client.search_runs([experiment_id], query, order_by=["attributes.start_time ASC"], max_results=1)
    if found:
        run_id = found[0].info.run_id
    else:
        made = client.create_run(experiment_id, run_name=policy.stage, tags={TRAINED_IN_TAG: policy.run_id})
        run_id = made.info.run_id
        client.set_terminated(run_id)
    logger.warning(
        "%s was trained in run %s, which is not in this tracking store (%s; MLFLOW_TRACKING_URI changed since the "
        "round ran): registering it from run %s here, which does not hold its training metrics",
        policy.stage, policy.run_id, client.tracking_uri, run_id,
    )  # fmt: skip
    return policy.model_copy(update={"run_id": run_id})


def _metric(result: EvalResult, name: str) -> float:
    metrics = result.metrics()
    try:
        name = split_metric(name, [result.suite])[1].name
    except ValueError as e:
        raise ValueError(f"registry.gating_metric: {e}") from None
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
@stage("register", unkeyed=("config_yaml", "tags"), external=_tracking_store)
def register_policy(
    policy: Checkpoint,
    result: EvalResult,
    baseline: EvalResult | None,
    cfg: RegistryConfig,
    ctx: RunContext,
    config_yaml: str,
    tags: dict[str, str],
    suites: dict[str, EvalResult] | None = None,
    baselines: dict[str, EvalResult] | None = None,
    matrix: list[StageRow] | None = None,
) -> StoredRegistration:
    """Log scores, config and the model (an MLflow transformers model) to the policy's run, and register a version
    of `cfg.model_name` that takes `champion` only if the gate promotes it. `result` and `baseline` are the gating
    suite's scores; `suites` and `baselines` every suite's, by name (the gating suite's among them): each is logged
    under its name, shown in the card, and the guarded ones (`cfg.guard`) gate the promotion too. `matrix`: a staged
    recipe's stage x suite matrix so far, this version its last row, for the card."""
    from mlflow import MlflowClient

    if policy.run_id is None:
        raise ValueError("only a trained policy (with an MLflow run) can be registered")
    _metric(result, cfg.gating_metric)
    suites = suites or {result.suite: result}
    path = policy.require()
    require_reachable(tracking_uri(ctx.run_dir))  # fail in seconds, not after MLflow's own minutes of retries
    experiment_id = configure_mlflow(ctx.run_dir, cfg.experiment)
    client = MlflowClient()
    with registry_lock(ctx.run_dir, cfg.model_name):  # another run gating the same model waits its turn
        policy = _run_in_this_store(client, policy, experiment_id)
        existing = version_of_run(client, cfg.model_name, policy.run_id)

        def gated(items: pd.DataFrame) -> tuple[GateDecision, dict[str, str], str]:
            gate = decide(client, cfg, result, items, ctx, alarms=policy.alarms, suites=suites)
            all_tags = {
                **tags, **provenance_tags(result), **suite_tags(suites), **health_tags(policy.alarms), **gate.tags(),
            }  # fmt: skip
            prompt = str(items["prompt"].iloc[0])
            card = model_card(
                cfg, policy, result, baseline, gate, all_tags, config_yaml, prompt=prompt, suites=suites,
                baselines=baselines, text_calls=calls_in_text(path, config_yaml), matrix=matrix,
            )  # fmt: skip
            return gate, all_tags, card

        if existing is not None:
            logger.info("run %s is version %s already; not registered again", policy.run_id, existing.version)
            if pending(existing) and not existing.aliases and champion_moved(client, existing):
                gate, _, card = gated(result.items())
                existing = regate(client, existing, gate, card)
            return _stored(registration_of(client, finished(client, existing)), ctx)
        items = result.items()
        gate, tags, card = gated(items)
        model_id = _log_policy_run(
            client, policy, path, result, items, baseline, config_yaml, tags, card, (suites, baselines or {})
        )
        return _stored(create_gated_version(client, cfg, policy.run_id, model_id, gate, tags, card), ctx)


def calls_in_text(path: Path, config_yaml: str) -> bool:
    """Whether the policy at `path`, trained with tools, calls them in text (its chat template cannot carry tool
    calls: agents/text_tools.py), which the card tells its users; False for a recipe without tools."""
    if not trained_tools(config_yaml):
        return False
    from grpo_pipeline.agents.text_tools import needs_text_loop

    return needs_text_loop(load_tokenizer(str(path)))


def _log_suites(suites: dict[str, EvalResult], baselines: dict[str, EvalResult]) -> None:
    """Every suite's scores under its name (`gsm8k_test/accuracy`, and `sft/gsm8k_test/accuracy` for the model
    GRPO started from), with how many items each metric left unscored and its per-item scores (where a later gate
    reads the champion's)."""
    import mlflow

    for name, res in suites.items():
        mlflow.log_metrics(res.metrics(f"{name}/"))
        mlflow.log_metrics({f"{name}/unscored/{metric}": n for metric, n in res.unscored.items()})
        mlflow.log_metrics(
            {f"{name}/accuracy_ci_low": res.accuracy_ci[0], f"{name}/accuracy_ci_high": res.accuracy_ci[1]}
        )
        if name in baselines:
            mlflow.log_metrics(baselines[name].metrics(f"sft/{name}/"))
        mlflow.log_artifact(res.items_path, str(Path(suite_items_artifact(name)).parent))


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
    every: tuple[dict[str, EvalResult], dict[str, EvalResult]] = ({}, {}),
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
        _log_suites(*every)
        logged = {a.path for a in client.list_artifacts(policy.run_id, str(Path(COMPLETIONS_TABLE).parent))}
        if COMPLETIONS_TABLE not in logged:
            mlflow.log_table(completions_table(items), artifact_file=COMPLETIONS_TABLE)
        _log_learning_curve(client, policy, result, baseline)
        mlflow.set_tags(tags)
        model_id = logged_model_of(client, policy)
        if model_id is not None:
            logger.info("run %s holds this checkpoint's model already (%s): not logged again", policy.run_id, model_id)
            return model_id
        model_id = log_transformers_model(path, card, result.max_new_tokens).model_id
        client.set_logged_model_tags(model_id, {CHECKPOINT_TAG: policy.fingerprint})  # complete: a retry may reuse it
        return model_id
