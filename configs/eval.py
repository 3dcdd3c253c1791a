"""The `eval:` section: greedy accuracy and pass@k / maj@k on the held-out split (tasks/evaluate.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pipeline.configs.base import Section


class EvalConfig(Section):
    max_problems: int | None = Field(default=None, ge=1, description="Evaluate on at most this many held-out rows.")
    n_samples: int = Field(default=8, ge=1, description="Sampled completions per problem for pass@k (n).")
    k: list[int] = Field(default=[1, 4, 8], min_length=1, description="The k values of pass@k (each <= n_samples).")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature for pass@k.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling for pass@k.")
    max_new_tokens: int = Field(default=8, ge=1, description="Longest evaluated completion (tokens).")
    batch_size: int = Field(
        default=256,
        ge=1,
        description="Sequences per generation batch: prompts x completions (a pass@k batch holds batch_size / "
        "n_samples prompts).",
    )
    backend: Literal["auto", "hf", "vllm"] = Field(
        default="auto",
        description="What generates the evaluated completions: 'vllm' (the vllm package: the gpu extra on CUDA, or "
        "vLLM's CPU build), 'hf' (transformers' generate), 'auto' (vLLM where it is installed, else generate). Either "
        "samples with these settings only, whatever the checkpoint's generation_config asks, tokenizes prompts as "
        "training does and records the sampler it applied; a real model's evaluation is its slowest stage under "
        "generate.",
    )
    correctness_reward: str = Field(
        default="correctness", description="The reward (name or dotted path) that decides if a completion is correct."
    )
    max_unscored_fraction: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Largest share of the evaluated completions (greedy and sampled) that the correctness reward may "
        "leave unscored (None: a sandbox that could not start the program, a math-verify timeout, an unreachable "
        "judge) after scoring them once more. Below it they are left out of accuracy, pass@k and maj@k and counted "
        "as `unscored`; above it the evaluation stops with the first reason and nothing is registered.",
    )

    @model_validator(mode="after")
    def _k_fits_n(self) -> EvalConfig:
        too_big = [k for k in self.k if k > self.n_samples]
        if too_big:
            raise ValueError(
                f"eval.k values {too_big} exceed eval.n_samples={self.n_samples}; raise n_samples or drop them"
            )
        # A pass@k batch holds whole groups: batch_size // n_samples prompts with all their samples
        # (tasks/scoring/generation.py). Below one group it would hold n_samples sequences all the same.
        if self.batch_size < self.n_samples:
            raise ValueError(
                f"eval.batch_size ({self.batch_size}) cannot hold one group of eval.n_samples ({self.n_samples}) "
                f"samples of a prompt; raise eval.batch_size to a multiple of {self.n_samples} or lower eval.n_samples"
            )
        return self
