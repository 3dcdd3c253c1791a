"""The current champion and its per-item scores, as the gate reads them from MLflow.

The champion is the version of the registered model that holds the alias `champion`. Only MLflow's answer that the
model or that alias does not exist means "no champion yet" (`current_champion`); any other error propagates. The
champion's per-item scores are the ones logged with its run (`ITEMS_ARTIFACT` for its gating suite,
`suite_items_artifact` for each suite) when its version tags (`suite_tags` and the gating suite's eval settings) say
they were scored on this eval set with these settings; otherwise the champion is evaluated again (`champion_items`).
The comparison itself is tasks/release/gate.py's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from grpo_pipeline.configs.schema import HELDOUT
from grpo_pipeline.tasks.core.common import Ref, logger
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.release.registered import fetch_registered
from grpo_pipeline.tasks.scoring.evaluation import evaluate_model
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

ITEMS_ARTIFACT = f"eval/{ITEMS_FILE}"  # the gating suite's items
SUITE_TAG = "suite."  # suite.<name>.<eval setting>: the settings every suite's scores were computed with
CHAMPION = "champion"


def suite_items_artifact(suite: str) -> str:
    """Where a suite's per-item scores are logged on the policy's run."""
    return f"eval/suites/{suite}/{ITEMS_FILE}"


def suite_tags(results: Mapping[str, EvalResult]) -> dict[str, str]:
    """Every suite's eval settings as version tags (`suite.<name>.eval_fingerprint`, ...): what a later gate checks
    before it compares its items with these."""
    return {f"{SUITE_TAG}{name}.{k}": str(v) for name, r in results.items() for k, v in r.settings().items()}


def current_champion(client: MlflowClient, model_name: str) -> ModelVersion | None:
    """The version of `model_name` that holds `champion`, or None when the model or the alias does not exist.

    MLflow 3.17 says "not found" with RESOURCE_DOES_NOT_EXIST for a missing model and with INVALID_PARAMETER_VALUE
    ("Registered model alias champion not found.", model_registry/sqlalchemy_store.py) for a missing alias; that
    second code also answers other bad requests, so the model's own aliases confirm it. Any other error (a server
    error, a refused permission, a store that cannot be read) propagates: it says nothing about the champion."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        lookup = e
    try:
        aliases = client.get_registered_model(model_name).aliases
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    if CHAMPION in aliases:
        raise lookup  # the alias exists: the lookup failed for another reason
    return None


def champion_items(client: MlflowClient, champion: ModelVersion, result: EvalResult, ctx: RunContext) -> pd.DataFrame:
    """The champion's per-item scores on `result`'s eval set with `result`'s settings: the ones logged with its run
    (for the suite, or as its gating suite's) when they match, else a fresh evaluation of the champion (kept under
    the run directory)."""
    settings = {k: str(v) for k, v in result.settings().items()}
    logged_as = [(f"{SUITE_TAG}{result.suite}.", suite_items_artifact(result.suite)), ("", ITEMS_ARTIFACT)]
    for prefix, artifact in logged_as:
        if all(champion.tags.get(prefix + k) == v for k, v in settings.items()):
            logged = _logged_items(champion.run_id, artifact)
            if logged is not None:
                return logged
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
        label=f"champion v{champion.version}" + ("" if result.suite == HELDOUT else f" on {result.suite}"),
    )
    return rescored.items()


def _logged_items(run_id: str, artifact: str = ITEMS_ARTIFACT) -> pd.DataFrame | None:
    import mlflow
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact, dst_path=tmp)
        except (MlflowException, OSError):
            return None
        return pd.read_json(path, lines=True, dtype=False)
