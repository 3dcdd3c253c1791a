"""The pipeline as one Prefect flow. It reads top to bottom like the DAG it runs:

    prepare_data -> validate_data -> base_model -> sft_warmup -> evaluate(sft)
        -> [round r = 1..R: grpo_train(r) -> evaluate(r) -> register(r)]

Each stage is a thin Prefect task over a plain function in tasks/ (usable without Prefect). Tasks exchange paths
plus content fingerprints, never models or DataFrames, and each task's cache key is its inputs (config section +
fingerprints) plus its source: rerunning an unchanged config hits the cache everywhere, and changing only `grpo.*`
reruns GRPO and what follows it.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig
from grpo_pipeline.flows.summary import StageRecord, Summary
from grpo_pipeline.rewards.registry import RewardError
from grpo_pipeline.tasks.data import DataError
from grpo_pipeline.tasks.data import prepare_data as _prepare_data
from grpo_pipeline.tasks.evaluate import EvalResult
from grpo_pipeline.tasks.evaluate import evaluate as _evaluate
from grpo_pipeline.tasks.grpo import grpo_train as _grpo_train
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.register import Registration, register_policy
from grpo_pipeline.tasks.sft import sft_warmup as _sft_warmup
from grpo_pipeline.tasks.validate import DataValidationError
from grpo_pipeline.tasks.validate import validate_data as _validate_data

# Bad input is not retried: a second try would fail the same way and only delay the error.
NOT_RETRIED = (ConfigError, DataError, DataValidationError, RewardError, FileNotFoundError, ValueError, TypeError)


def retry_unless_bad_input(task, task_run, state) -> bool:
    try:
        state.result()
    except NOT_RETRIED:
        return False
    except Exception:
        return True
    return True


STAGE = dict(
    cache_policy=INPUTS + TASK_SOURCE,
    persist_result=True,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_unless_bad_input,
)


# Each task takes only its own config section and the fingerprinted outputs it consumes, so its cache key changes
# exactly when its inputs do. The plain functions in tasks/ are the tasks; Prefect adds caching, retries, states.
prepare_data = task(_prepare_data, name="prepare_data", **STAGE)
validate_data = task(_validate_data, name="validate_data", **STAGE)
base_model = task(prepare_base_model, name="base_model", **STAGE)
sft_warmup = task(_sft_warmup, name="sft_warmup", **STAGE)
grpo_train = task(_grpo_train, name="grpo_train", task_run_name="grpo_train-r{round_index}", **STAGE)
evaluate = task(_evaluate, name="evaluate", task_run_name="evaluate-{label}", **STAGE)
# The resolved config and its tags are logged, not keyed: a new version is registered only when the policy, its
# scores or the registry settings change.
register = task(
    register_policy,
    name="register",
    **{**STAGE, "cache_policy": (INPUTS - "config_yaml" - "tags") + TASK_SOURCE},
)


def _run(records: list[StageRecord], record_name: str, stage, /, *args: Any, **kwargs: Any):
    """Run a task, record its wall time and whether it came from the cache, and return its result."""
    start = time.perf_counter()
    state = stage(*args, return_state=True, **kwargs)
    records.append(StageRecord(stage=record_name, seconds=time.perf_counter() - start, cached=state.name == "Cached", state=state.name))
    return state.result()


@flow(name="grpo-pipeline", log_prints=False)
def grpo_pipeline(config: PipelineConfig) -> Summary:
    """Data -> validation -> SFT warmup -> R rounds of GRPO, each evaluated and registered in MLflow."""
    logger = get_run_logger()
    cfg = config
    records: list[StageRecord] = []

    data = _run(records, "prepare_data", prepare_data, cfg.data, cfg.run_dir)
    data = _run(records, "validate_data", validate_data, data, cfg.data)
    policy = _run(records, "base_model", base_model, cfg.model, cfg.run_dir, cfg.seed)
    mlflow_args = dict(run_dir=cfg.run_dir, experiment=cfg.registry.experiment, recipe=cfg.name, seed=cfg.seed)
    if cfg.sft.enabled:
        policy = _run(records, "sft_warmup", sft_warmup, policy, data.train, cfg.sft, cfg.model, **mlflow_args)
    eval_args = dict(held_out=data.eval, cfg=cfg.eval, run_dir=cfg.run_dir, seed=cfg.seed)
    baseline = _run(records, "evaluate-sft", evaluate, policy, label="sft", **eval_args)

    rounds: list[tuple[EvalResult, Registration | None]] = []
    for r in range(1, cfg.grpo.rounds + 1):
        # Each round starts from the previous policy; TRL builds the reference model from it (reset per round).
        policy = _run(
            records, f"grpo_train-r{r}", grpo_train, policy, data.train, cfg.grpo, cfg.model, r, **mlflow_args,
            held_out=data.eval, correctness_reward=cfg.eval.correctness_reward,
        )
        result = _run(records, f"evaluate-r{r}", evaluate, policy, label=f"r{r}", **eval_args)
        registration = None
        if cfg.registry.register_each_round or r == cfg.grpo.rounds:
            tags = {
                "config_hash": cfg.fingerprint(),
                "recipe": cfg.name,
                "data_fingerprint": data.train.fingerprint,
                "parent_model": policy.parent,
                "round": str(r),
            }
            registration = _run(
                records, f"register-r{r}", register, policy, result, baseline, cfg.registry, cfg.run_dir,
                cfg.to_yaml(), tags,
            )
        rounds.append((result, registration))

    summary = Summary.build(cfg, records, baseline, rounds)
    create_markdown_artifact(markdown=summary.to_markdown(), key="grpo-pipeline-summary", description="Run summary")
    logger.info("pipeline finished:\n%s", summary.to_markdown())
    return summary
