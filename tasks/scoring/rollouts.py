"""A policy sampled as a GRPO round samples it, each sample judged by evaluation's correctness reward: what the
difficulty filter measures pass rates with (tasks/difficulty.py) and what rejection sampling keeps the verified
completions of (tasks/rft.py), so "correct" means the same there as in training and evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict

from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.configs.schema import PipelineConfig, RewardSpec
from grpo_pipeline.rewards import build_spec
from grpo_pipeline.tasks.core.common import Checkpoint, load_tokenizer
from grpo_pipeline.tasks.core.stage import user_code
from grpo_pipeline.tasks.scoring.items import judge


class Rollouts(BaseModel):
    """How a stage samples and scores: as the round samples (`grpo.sampling`: episodes where it calls tools), so
    that what it measures is what the round's groups will see, with evaluation's correctness reward and generation
    batch."""

    model_config = ConfigDict(frozen=True)

    sampling: Sampling
    batch_size: int
    correctness_reward: RewardSpec

    @classmethod
    def of(cls, cfg: PipelineConfig) -> Rollouts:
        return cls(
            sampling=cfg.grpo.sampling, batch_size=cfg.eval.batch_size, correctness_reward=cfg.eval.correctness_reward
        )


def rollouts_code(params: Mapping[str, Any]) -> dict[str, str]:
    """The user's code a stage that samples `params["rollouts"]` runs: its correctness reward, tools, environment."""
    rollouts = params["rollouts"]
    s = rollouts.sampling
    return user_code([rollouts.correctness_reward.name, *s.tools, *filter(None, [s.environment])])


def sample_judged(
    policy: Checkpoint, rows: pd.DataFrame, n: int, rollouts: Rollouts, seed: int, label: str
) -> tuple[list[list[str]], list[list[bool | None]]]:
    """`n` samples of `policy` per row, and whether each is correct (None: the correctness reward could not score
    it); `label` titles the progress bar. With tools each sample is an episode, as the round's rollouts are
    (agents/loops.py `eval_tool_loop`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.agents.loops import eval_tool_loop
    from grpo_pipeline.tasks.scoring.episodes import hf_sampler

    tokenizer = load_tokenizer(policy.path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy.path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    torch.manual_seed(seed)
    s = rollouts.sampling
    sample = hf_sampler(model, tokenizer, eval_tool_loop(s, tokenizer), rows)
    sampled, _ = sample(
        rows["prompt"].tolist(), max_new_tokens=s.max_new_tokens, batch_size=rollouts.batch_size, n=n,
        temperature=s.temperature, top_p=s.top_p, desc=label,
    )  # fmt: skip
    judged, _ = judge(build_spec(rollouts.correctness_reward), rows, sampled)
    return sampled, judged
