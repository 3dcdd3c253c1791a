"""Check sft_check: has the SFT warmup learned its data? Said before GRPO starts, with the figures.

GRPO learns only from prompts the policy sometimes solves. An SFT warmup that never left a plateau (the default
recipe's units-digit plateau on some seeds, benchmarks/LEARNING.md) hands GRPO a policy that solves almost nothing,
and the run would go on to register a weak model and report a gain "not above zero" without saying why.

The bar is what the SFT data itself gives: the correctness reward's verdict on the training split's own targets
(the `completion` column, up to `MAX_ROWS` rows; an imperfect teacher's targets score below 100%). An SFT policy whose
greedy held-out accuracy (its evaluation) is below `monitors.sft_min_ratio` x that has not learned its data. The
check warns once, the run summary and the model card carry the warning, and `monitors.sft_not_learned: error` stops
the run there instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.configs.schema import MonitorsConfig, RewardSpec
from grpo_pipeline.rewards import build_spec
from grpo_pipeline.tasks.core.common import Ref, logger
from grpo_pipeline.tasks.core.stage import stage, user_code
from grpo_pipeline.tasks.scoring.items import judge
from grpo_pipeline.tasks.scoring.results import EvalResult

MAX_ROWS = 256  # training targets scored for the bar: enough for a mean within a few points


class SFTNotLearnedError(RuntimeError):
    """The SFT policy is far below its own training data and monitors.sft_not_learned is 'error'."""


class SFTCheck(BaseModel):
    targets_accuracy: float | None  # the correctness reward's verdict on the training targets (None: none scored)
    rows: int  # training targets scored
    sft_accuracy: float  # the SFT policy's greedy held-out accuracy
    warning: str | None = None  # set when SFT has not learned its data


def _reward_code(params: Mapping[str, Any]) -> dict[str, str]:
    return user_code([params["correctness_reward"].name])


@stage("sft_check", external=_reward_code)
def check_sft(train: Ref, sft: EvalResult, correctness_reward: RewardSpec, monitors: MonitorsConfig) -> SFTCheck:
    """Compare the SFT policy's held-out accuracy (`sft`) with the accuracy of its own training targets; warn (or,
    with monitors.sft_not_learned=error, raise SFTNotLearnedError) when it is below monitors.sft_min_ratio x that."""
    rows = pd.read_parquet(train.require()).head(MAX_ROWS)
    verdicts, _ = judge(build_spec(correctness_reward), rows, [[str(c)] for c in rows["completion"]])
    scored = [v[0] for v in verdicts if v[0] is not None]
    targets = sum(scored) / len(scored) if scored else None
    check = SFTCheck(targets_accuracy=targets, rows=len(scored), sft_accuracy=sft.accuracy)
    if targets is None or not sft.accuracy < monitors.sft_min_ratio * targets:
        logger.info(
            "sft_check: the SFT policy's held-out accuracy %.1f%% is at least monitors.sft_min_ratio=%s x its "
            "training targets' %s",
            100 * sft.accuracy,
            monitors.sft_min_ratio,
            "(none scored)" if targets is None else f"{100 * targets:.1f}%",
        )
        return check
    warning = (
        f"SFT has not learned its data: the SFT policy's greedy held-out accuracy is {sft.accuracy:.1%}, below "
        f"monitors.sft_min_ratio={monitors.sft_min_ratio} x {targets:.1%}, the accuracy of its own training "
        f"targets ({len(scored)} rows scored by {correctness_reward.name!r}). GRPO learns only from prompts the policy "
        "sometimes solves: train SFT longer (sft.max_steps, sft.learning_rate) or check its data"
    )
    if monitors.sft_not_learned == "error":
        raise SFTNotLearnedError(f"{warning}; monitors.sft_not_learned=error stops the run here")
    logger.warning("%s", warning)
    return check.model_copy(update={"warning": warning})
