"""The pipeline's stages as Prefect tasks, and what runs them.

Each stage is a thin Prefect task over a plain function in tasks/ (usable without Prefect), cached under the one key
that also names its output directory (tasks/core/stage.py) and retried unless the failure is the user's to fix (bad
input) or would recur (a training-health alarm). `Stages` runs them for the flow (flows/grpo_pipeline.py), records
each run's wall time, cache hit and resume point for the summary, and rebuilds a cached result whose files changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from grpo_pipeline.configs.schema import ConfigError
from grpo_pipeline.flows.grpo_train import RoundFailed, remote_grpo_train
from grpo_pipeline.flows.summary import StageRecord
from grpo_pipeline.rewards.registry import RewardError
from grpo_pipeline.tasks.core.common import damaged
from grpo_pipeline.tasks.core.tracking import unreachable
from grpo_pipeline.tasks.data import prepare_data as _prepare_data
from grpo_pipeline.tasks.data import replay_mixture as _replay_mixture
from grpo_pipeline.tasks.decontaminate import decontaminate as _decontaminate
from grpo_pipeline.tasks.difficulty import (
    DifficultyFilterError,
)
from grpo_pipeline.tasks.difficulty import filter_by_difficulty as _filter_by_difficulty
from grpo_pipeline.tasks.evaluate import evaluate as _evaluate
from grpo_pipeline.tasks.grpo import grpo_train as _grpo_train
from grpo_pipeline.tasks.model import pin_registered, prepare_base_model
from grpo_pipeline.tasks.preflight import PreflightError
from grpo_pipeline.tasks.preflight import check_inputs as _check_inputs
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.rft import rejection_sample as _rejection_sample
from grpo_pipeline.tasks.sft import sft_warmup as _sft_warmup
from grpo_pipeline.tasks.sft_check import SFTNotLearnedError
from grpo_pipeline.tasks.sft_check import check_sft as _check_sft
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.contract import DataValidationError
from grpo_pipeline.tasks.suites import prepare_suite as _prepare_suite
from grpo_pipeline.tasks.training.monitor import TrainingHealthError
from grpo_pipeline.tasks.validate import validate_data as _validate_data

STAGE_RETRIES = 2  # 5 s apart
REGISTER_RETRIES = 6  # with exponential backoff (see `register` below)
# Bad input: the user's to fix, reported as one message without a traceback (grpo_pipeline/cli.py).
# An SFT that has not learned its data, with monitors.sft_not_learned=error, stops the run the same way, as does a
# difficulty filter that leaves a round too few prompts with grpo.difficulty_filter.on_too_few=fail.
BAD_INPUT = (
    ConfigError, DataError, DataValidationError, RewardError, PreflightError, SFTNotLearnedError,
    DifficultyFilterError,
)  # fmt: skip
# Bad input is not retried: a second try would fail the same way and only delay the error.
# A round stopped by a training-health alarm (monitors.fail_fast, NaN weights) would train into the same alarm again.
NOT_RETRIED = (*BAD_INPUT, TrainingHealthError, FileNotFoundError, ValueError, TypeError)


def retry_unless_bad_input(task: Task, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except NOT_RETRIED:
        return False
    except Exception:
        return True
    return True


def retry_registration(task: Task, task_run: Any, state: Any) -> bool:
    """An unreachable MLflow is retried through every delay of the register stage (the server may be restarting);
    any other failure as often as any stage's."""
    try:
        state.result()
    except Exception as e:
        if unreachable(e):
            return True
        return retry_unless_bad_input(task, task_run, state) and task_run.run_count <= STAGE_RETRIES
    return True


def retry_remote_round(task: Task, task_run: Any, state: Any) -> bool:
    """A round on another work pool is retried like a local one: not when its child flow run was cancelled, nor when
    the child failed on bad input or a training-health alarm (its final message names the error)."""
    try:
        state.result()
    except RoundFailed as e:
        named = any(f"{kind.__name__}:" in e.message for kind in NOT_RETRIED)
        return not named and e.state_name not in ("Cancelled", "Cancelling")
    except Exception:
        return retry_unless_bad_input(task, task_run, state)
    return True


RETRIED: dict[str, Any] = {
    "retries": STAGE_RETRIES,
    "retry_delay_seconds": 5,
    "retry_condition_fn": retry_unless_bad_input,
}


def stage_task(fn: Callable[..., Any], name: str, **options: Any) -> Task:
    """A Prefect task over a stage function, cached under the stage's own key (see tasks/core/stage.py)."""
    return task(fn, name=name, cache_key_fn=fn.stage.cache_key, persist_result=True, **{**RETRIED, **options})


prepare_data = stage_task(_prepare_data, "prepare_data")
validate_data = stage_task(_validate_data, "validate_data")
prepare_suite = stage_task(_prepare_suite, "prepare_suite", task_run_name="prepare_suite-{suite.name}")
decontaminate = stage_task(_decontaminate, "decontaminate")
# An alias (models:/x@champion) names one version for the whole run; resolved afresh by every run, never cached.
pin_model = task(pin_registered, name="pin_model", cache_policy=NO_CACHE, **RETRIED)
base_model = stage_task(prepare_base_model, "base_model")
check_inputs = stage_task(_check_inputs, "check_inputs")
sft_warmup = stage_task(_sft_warmup, "sft_warmup")
check_sft = stage_task(_check_sft, "check_sft")
difficulty_filter = stage_task(_filter_by_difficulty, "difficulty_filter", task_run_name="difficulty_filter-{label}")
rejection_sample = stage_task(_rejection_sample, "rejection_sample", task_run_name="rejection_sample-{label}")
replay_mixture = stage_task(_replay_mixture, "replay_mixture", task_run_name="replay-{label}")
grpo_train = stage_task(_grpo_train, "grpo_train", task_run_name="{spec.name}")
# The same stage on another work pool (grpo.work_pool), keyed like the local one, and retried like it: a child flow
# run that failed for a passing reason runs again (resuming from its checkpoints); bad input, a health alarm or a
# cancelled child fails at once with the round's own error.
grpo_train_remote = task(
    remote_grpo_train,
    name="grpo_train",
    task_run_name="{spec.name}",
    cache_key_fn=_grpo_train.stage.cache_key,
    persist_result=True,
    **{**RETRIED, "retry_condition_fn": retry_remote_round},
)
evaluate = stage_task(_evaluate, "evaluate", task_run_name="evaluate-{label}")
# Registration outlasts an MLflow outage (a server restart, a deploy): the training it registers is done and cached,
# so waiting costs nothing but time. The stage checks the server first (tracking.require_reachable) and fails
# in seconds, and Prefect logs each retry with its delay: 5, 10, 20, 40, 80, 160 s, about five minutes in all.
# Registration is idempotent (tasks/register.py), so a retry after a failure mid-way leaves one version.
register = stage_task(
    register_policy,
    "register",
    retries=REGISTER_RETRIES,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_condition_fn=retry_registration,
)


@dataclass
class Stages:
    """Runs the flow's stages: each run's wall time, cache hit and resume point are recorded for the run summary.

    A cached result is used only while the files it points to are intact; otherwise the stage is rebuilt.
    Checks (`listed=False`) run the same way but stay out of the summary's table of stages."""

    records: list[StageRecord] = field(default_factory=list)
    suite_seconds: dict[str, float] = field(default_factory=dict)  # each eval suite's evaluations, all models

    def __call__(self, name: str, stage: Task, /, *, listed: bool = True, **inputs: Any) -> Any:
        start = time.perf_counter()
        return self._finish(name, stage, inputs, stage(return_state=True, **inputs), start, listed)

    def at_once(self, calls: list[tuple[str, Task, dict[str, Any]]]) -> list[Any]:
        """The stages of `calls` (name, task, inputs) submitted together to the flow's task runner (threads, each
        waiting on its own work: a Ray task with distributed.backend ray), their results in order; each recorded
        with the time from the common start to its own end."""
        start = time.perf_counter()
        futures = [stage.submit(**inputs) for _, stage, inputs in calls]
        for future in futures:
            future.wait()
        return [self._finish(n, s, i, f.state, start, True) for (n, s, i), f in zip(calls, futures, strict=True)]

    def _finish(self, name: str, stage: Task, inputs: dict[str, Any], state: Any, start: float, listed: bool) -> Any:
        if state.name == "Cached" and (problems := damaged(state.result())):
            get_run_logger().warning("%s: not using the cached result (%s); rebuilding it", name, "; ".join(problems))
            state = stage.with_options(refresh_cache=True)(return_state=True, **inputs)
        seconds = time.perf_counter() - start
        result, cached = state.result(), state.name == "Cached"
        resumed = getattr(result, "resumed_from_step", None)
        note = f"resumed from step {resumed}" if resumed is not None and not cached else ""
        if listed:
            self.records.append(StageRecord(stage=name, seconds=seconds, cached=cached, state=state.name, note=note))
        return result
