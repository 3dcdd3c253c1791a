"""The GRPO objective: loss type, importance sampling level (GSPO), clipping, entropy controls, updates per
generation, reward scaling and the off-policy corrections. Every field keeps TRL's name (`trl.GRPOConfig`) and
reaches TRL unchanged through `trl_grpo_args` (tasks/grpo.py); docs/algorithms.md has a table of them with their
papers. The fields sit flat in the `grpo:` section (`grpo.loss_type`, `grpo.epsilon_high`, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pipeline.configs.base import Section

# Loss types that clip the importance ratio PPO-style, the only ones `delta` (two-sided clipping) applies to.
PPO_CLIPPED_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo", "luspo")
# Loss types that sum per-token terms: with sequence-level ratios they weight each sequence by its length.
TOKEN_SUM_LOSSES = ("dr_grpo", "dapo", "bnpo", "cispo")
VLLM_CORRECTION_FIELDS = (
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)
# loss_type vespo reweights whole sequences itself, so a vLLM correction under it must be per token (TRL refuses a
# sequence-level mode): the mode it takes when none is given.
VESPO_VLLM_MODE = "token_truncate"


class PolicyLossConfig(Section):
    """The fields of `grpo:` that define the policy-gradient objective, each passed to TRL under its own name."""

    # Parameters that control the loss
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = Field(
        default="dapo",
        description="The loss (TRL's loss_type). Token aggregation of the clipped objective: 'dapo' over the "
        "batch's tokens (DAPO, Yu et al. 2025; the default, no length bias), 'grpo' per sequence then over the "
        "group (DeepSeekMath; biased towards short right and long wrong answers), 'dr_grpo' by a constant "
        "(Dr. GRPO, Liu et al. 2025), 'bnpo' over the local batch's tokens. Other objectives: 'cispo' clips the "
        "importance weight, not the update, and keeps every token's gradient (MiniMax-M1, 2025; set epsilon_high, "
        "e.g. 5.0); 'sapo' a smooth temperature gate instead of hard clipping (SAPO, 2025); 'luspo' a "
        "length-unbiased sequence-level loss (LUSPO, 2026; needs importance_sampling_level: sequence); 'vespo' a "
        "Gamma weighting of sequence-level importance weights (VESPO, 2026).",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        default="token",
        description="'token': one importance ratio per token (GRPO, PPO). 'sequence': one ratio per completion, the "
        "geometric mean of its tokens' ratios: GSPO (Zheng et al. 2025), more stable for long completions and MoE "
        "models; use it with loss_type grpo, sapo or luspo.",
    )
    beta: float = Field(default=0.0, ge=0, description="KL coefficient against the reference model; 0 disables it.")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Divide advantages by the group's ('group', GRPO), the batch's ('batch', PPO Lite) or no "
        "('none', Dr. GRPO: std scaling favours too easy and too hard prompts) reward standard deviation.",
    )

    # Parameters that control clipping
    epsilon: float = Field(default=0.2, gt=0, description="PPO-style clipping range of the importance ratio.")
    epsilon_high: float | None = Field(
        default=None,
        gt=0,
        description="Upper clipping bound, when it differs from epsilon: clip-higher (DAPO, Yu et al. 2025 sec. "
        "3.1, recommends 0.28) lets unlikely tokens grow and keeps entropy from collapsing. For loss_type cispo it "
        "is the importance-weight cap (ScaleRL recommends 5.0). None: epsilon.",
    )
    delta: float | None = Field(
        default=None,
        gt=1,
        description="Two-sided clipping (INTELLECT-2, 2025): also cap the ratio at delta for negative advantages, "
        "where PPO leaves it unbounded; must exceed 1 + the upper clipping bound. For the clipped losses (grpo, "
        "dr_grpo, dapo, bnpo, luspo). None: off.",
    )

    # Parameters that control entropy
    top_entropy_quantile: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Train only on the top quantile of tokens by the policy's entropy (Wang et al. 2025, 'Beyond the "
        "80/20 rule', recommends 0.2): the forking tokens carry the learning. 1 keeps every token.",
    )
    entropy_coef: float = Field(
        default=0.0,
        ge=0,
        description="Entropy bonus: adds entropy_coef times the mean token entropy to the objective, against entropy "
        "collapse (Skywork-OR1, 2025). 0: off.",
    )
    mask_truncated_completions: bool = Field(
        default=False,
        description="Leave completions cut at max_completion_tokens out of the loss (DAPO sec. 3.3, overlong "
        "filtering): a truncated answer is not a wrong one. Useless when nearly every completion is truncated.",
    )

    # Parameters that control how often each generation is used
    num_iterations: int = Field(
        default=1,
        ge=1,
        description="Optimizer passes over each generated batch (μ in DeepSeekMath's algorithm 1); above 1 the later "
        "passes are off-policy and the clipping starts to matter.",
    )
    steps_per_generation: int | None = Field(
        default=None,
        ge=1,
        description="Optimizer steps taken from one generation call: each call generates this many steps' batches "
        "at once (faster rollouts, slightly off-policy later steps). None: 1.",
    )

    # Parameters that correct for off-policy samples
    off_policy_mask_threshold: float | None = Field(
        default=None,
        gt=0,
        description="Off-policy sequence masking (DeepSeek-V3.2, 2025, eq. 9): drop negative-advantage completions "
        "whose mean KL from the sampling policy exceeds this (e.g. 0.5). Acts only where samples are off-policy: "
        "num_iterations or steps_per_generation above 1, or vLLM rollouts. None: off.",
    )
    vllm_importance_sampling_correction: bool = Field(
        default=True,
        description="vLLM rollouts only: reweight each token by the ratio of the trainer's to vLLM's probability, "
        "correcting the mismatch between the inference and training engines (Yao et al. 2025, 'Your efficient RL "
        "framework secretly brings you off-policy RL training').",
    )
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        Field(
            default="sequence_mask",
            description="vLLM rollouts only: per token or per sequence ratios, clipped into [clip_min, clip_max] "
            "('truncate') or zeroed outside it ('mask'). loss_type vespo needs a token_* mode, and takes "
            "token_truncate when none is given (and vLLM may be used).",
        )
    )
    vllm_importance_sampling_clip_min: float | None = Field(
        default=None, gt=0, description="vLLM rollouts only: lower bound of the correction's ratio; None: none."
    )
    vllm_importance_sampling_clip_max: float | None = Field(
        default=3.0, gt=0, description="vLLM rollouts only: upper bound of the correction's ratio; None: none."
    )

    def algorithm(self) -> dict[str, object]:
        """The objective's settings by TRL name, as recorded on each round and registered version."""
        return {name: getattr(self, name) for name in PolicyLossConfig.model_fields}

    @model_validator(mode="after")
    def _loss_settings_agree(self) -> PolicyLossConfig:
        for problem in _loss_conflicts(self):
            raise ValueError(problem)
        return self


def vllm_corrections_set(c: PolicyLossConfig) -> list[str]:
    """The vLLM correction fields whose value is not their default, by name. A value, never whether it was written:
    a config dumped in full (to a remote worker, to the run's config.yaml) must mean what it meant before."""
    return [name for name in VLLM_CORRECTION_FIELDS if getattr(c, name) != PolicyLossConfig.model_fields[name].default]


def _loss_conflicts(c: PolicyLossConfig) -> list[str]:
    """What contradicts what in the objective's settings, each with the change that fixes it."""
    problems, high = [], c.epsilon_high if c.epsilon_high is not None else c.epsilon
    if c.loss_type == "cispo" and c.epsilon_high is None:
        problems.append(
            "loss_type cispo caps importance weights at epsilon_high, which defaults to epsilon (0.2) and would "
            "scale every update down; set grpo.epsilon_high (ScaleRL recommends 5.0)"
        )
    if c.loss_type != "cispo" and c.epsilon_high is not None and c.epsilon_high < c.epsilon:
        problems.append(
            f"epsilon_high ({c.epsilon_high}) is below epsilon ({c.epsilon}); clip-higher widens the upper bound: "
            "raise grpo.epsilon_high (DAPO uses 0.28) or leave it unset"
        )
    if c.delta is not None and c.loss_type not in PPO_CLIPPED_LOSSES:
        problems.append(
            f"delta (two-sided clipping) applies to the clipped losses {', '.join(PPO_CLIPPED_LOSSES)}, not "
            f"{c.loss_type}; unset grpo.delta or change grpo.loss_type"
        )
    elif c.delta is not None and c.delta <= 1 + high:
        problems.append(f"delta ({c.delta}) must exceed 1 + the upper clipping bound ({1 + high:g}); raise grpo.delta")
    if c.loss_type == "luspo" and c.importance_sampling_level != "sequence":
        problems.append("loss_type luspo is a sequence-level loss; set grpo.importance_sampling_level=sequence")
    if c.loss_type == "vespo" and c.importance_sampling_level != "token":
        problems.append(
            "loss_type vespo computes its sequence-level weights itself; set grpo.importance_sampling_level=token"
        )
    if c.importance_sampling_level == "sequence" and c.loss_type in TOKEN_SUM_LOSSES:
        problems.append(
            f"importance_sampling_level sequence (GSPO) with loss_type {c.loss_type} sums per-token terms and weights "
            "each completion by its length; GSPO's objective is loss_type grpo (or sapo, luspo): set grpo.loss_type"
        )
    truncating = c.vllm_importance_sampling_mode.endswith("_truncate")
    if truncating and c.vllm_importance_sampling_clip_min is None and c.vllm_importance_sampling_clip_max is None:
        problems.append(
            f"vllm_importance_sampling_mode {c.vllm_importance_sampling_mode} clips the ratio but neither "
            "vllm_importance_sampling_clip_min nor _clip_max is set; set one (e.g. grpo.vllm_importance_sampling_"
            "clip_max=3.0)"
        )
    lo, hi = c.vllm_importance_sampling_clip_min, c.vllm_importance_sampling_clip_max
    if lo is not None and hi is not None and lo >= hi:
        problems.append(
            f"vllm_importance_sampling_clip_min ({lo}) must be below vllm_importance_sampling_clip_max ({hi})"
        )
    return problems
