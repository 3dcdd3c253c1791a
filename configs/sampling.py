"""How a policy is sampled, as one value: the decoding settings and, for a tool-using policy, the episode each sample
is. The GRPO rounds' rollouts (`GRPOStageConfig.sampling`), evaluation (`EvalConfig.sampling`), the probes and the
difficulty filter all read it from here, so what the filter measures and the probes score is what a round samples."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from grpo_pipeline.configs.base import Section


class Sampling(Section):
    """A policy's completions: how they are decoded and what tools they may call on the way."""

    temperature: float | None = Field(description="Sampling temperature; None: greedy decoding.")
    top_p: float = Field(default=1.0, description="Nucleus sampling (1: off).")
    max_new_tokens: int = Field(description="Longest completion (tokens); an episode's turns all count against it.")
    tools: tuple[str, ...] = Field(default=(), description="The tools each sample may call (built-in names or paths).")
    tool_params: dict[str, dict[str, Any]] = Field(default={}, description="Built-in tools' keyword arguments.")
    max_tool_turns: int = Field(default=1, description="Tool calls per episode at most.")
    environment: str | None = Field(
        default=None, description="The environment class a fresh instance of which each episode is reset with."
    )

    @property
    def uses_tools(self) -> bool:
        """Whether each sample is an episode (tools or an environment) rather than one plain completion."""
        return bool(self.tools) or self.environment is not None

    def greedy(self) -> Sampling:
        """The same completions decoded greedily (what the probes score): no sampling setting left to key them."""
        return self.model_copy(update={"temperature": None, "top_p": 1.0})
