"""Stage 5, evaluate: greedy accuracy, unbiased pass@k, maj@k and reward means of a policy on the held-out split.

The work is tasks/scoring/evaluation.py's `evaluate_model`; this stage keys it (the policy, the held-out split, the
eval config, the code of the rewards it scores with) and gives it its output folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import EvalConfig, RewardSpec
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.ray_tasks import on_cluster
from grpo_pipeline.tasks.core.stage import (
    RunContext,
    stage,
    user_code,
)
from grpo_pipeline.tasks.scoring.evaluation import evaluate_model
from grpo_pipeline.tasks.scoring.results import EvalResult


def _eval_code(params: dict[str, Any]) -> dict[str, str]:
    """The user code an evaluation runs: its rewards, and the tools and environment its episodes call."""
    cfg = params["cfg"]
    tools = [*(cfg.tools or ()), *([cfg.environment] if cfg.environment else [])]
    return user_code([cfg.correctness_reward.name, *(r.name for r in params.get("rewards") or ()), *tools])


def _here(result: EvalResult, params: dict[str, Any]) -> EvalResult:
    """The result of an evaluation run as a Ray task, naming the held-out rows by their path on this machine."""
    return result.model_copy(update={"eval_path": params["held_out"].path})


@stage("eval-{label}", external=_eval_code)
@on_cluster(localize=_here)  # with distributed.backend: ray, one Ray task on the cluster (tasks/core/ray_tasks.py)
def evaluate(
    policy: Checkpoint,
    held_out: Ref,
    cfg: EvalConfig,
    ctx: RunContext,
    label: str,
    rewards: list[RewardSpec] | None = None,
    *,
    out: Path,
) -> EvalResult:
    """Greedy accuracy, pass@k, maj@k and the mean of each of `rewards` for `policy` on the held-out split;
    per-item scores go to `out`."""
    return evaluate_model(policy.path, held_out, cfg, seed=ctx.seed, out=out, rewards=rewards or (), label=label)
