"""Which episode loop a model runs tools in: the one training runs on the same model (agents/episodes.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_pipeline.agents.chat_tools import ChatToolLoop
from grpo_pipeline.agents.registry import ToolError
from grpo_pipeline.agents.text_tools import TextToolLoop, needs_text_loop, text_tool_loop
from grpo_pipeline.agents.trainer_args import check_tokenizer

ToolLoop = TextToolLoop | ChatToolLoop


def eval_tool_loop(
    tools: Sequence[str] | None,
    max_turns: int | None,
    tokenizer: Any,
    environment: str | None = None,
    tool_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> ToolLoop | None:
    """The loop evaluation, the probes and the difficulty filter run for `tools`, their `tool_params` and
    `environment` (eval.tools, eval.tool_params and eval.environment, grpo's) on this tokenizer's model, the one
    training runs: in text where the chat template cannot carry tool calls, else TRL's loop through the chat template
    (agents/chat_tools.py), with a fresh environment instance per episode. None without tools or an environment."""
    if not tools and environment is None:
        return None
    if needs_text_loop(tokenizer):
        if environment is not None:
            raise ToolError(
                f"eval.environment: {environment!r} runs through TRL's tool loop, which needs a chat template that "
                "carries tool calls, and this model's cannot; use such a model, or set eval.tools=[] to score single "
                "completions"
            )
        return text_tool_loop(tools or [], max_turns or 1, "eval.tools")
    check_tokenizer(tokenizer)  # sets TRL's response template, as GRPOTrainer does
    return ChatToolLoop(tuple(tools or ()), max_turns or 1, environment, params=dict(tool_params or {}))
