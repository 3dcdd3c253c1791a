"""Which episode loop a model runs tools in: the one training runs on the same model (agents/episodes.py)."""

from __future__ import annotations

from typing import Any

from grpo_pipeline.agents.chat_tools import ChatToolLoop
from grpo_pipeline.agents.registry import ToolError
from grpo_pipeline.agents.text_tools import TextToolLoop, needs_text_loop, text_tool_loop
from grpo_pipeline.agents.trainer_args import check_tokenizer
from grpo_pipeline.configs.sampling import Sampling

ToolLoop = TextToolLoop | ChatToolLoop


def eval_tool_loop(sampling: Sampling, tokenizer: Any) -> ToolLoop | None:
    """The loop evaluation, the probes and the difficulty filter run `sampling`'s episodes in (its tools, their
    params, its environment and turn limit: eval's or grpo's) on this tokenizer's model, the one training runs: in text
    where the chat template cannot carry tool calls, else TRL's loop through the chat template (agents/chat_tools.py),
    with a fresh environment instance per episode. None where each sample is one plain completion."""
    if not sampling.uses_tools:
        return None
    if needs_text_loop(tokenizer):
        if sampling.environment is not None:
            raise ToolError(
                f"eval.environment: {sampling.environment!r} runs through TRL's tool loop, which needs a chat template "
                "that carries tool calls, and this model's cannot; use such a model, or set eval.tools=[] to score "
                "single completions"
            )
        return text_tool_loop(sampling.tools, sampling.max_tool_turns, "eval.tools")
    check_tokenizer(tokenizer)  # sets TRL's response template, as GRPOTrainer does
    return ChatToolLoop(sampling.tools, sampling.max_tool_turns, sampling.environment, params=sampling.tool_params)
