"""What a GRPO round hands TRL for tool use: `agent_args(cfg)` (GRPOConfig fields), `trainer_agent_kwargs(cfg,
tokenizer)` (GRPOTrainer's `tools=` and `environment_factory=`).

What TRL needs from the tokenizer (trl/trainer/grpo_trainer.py, GRPOTrainer.__init__, and trl/chat_template_utils.py;
docs/agents.md has the whole list): a chat template that renders a tool-calling exchange (`supports_tool_calling`),
a response template to parse the model's tool calls back (`add_response_schema` sets one for the templates TRL
knows, e.g. Qwen2.5's), and a template that renders earlier turns unchanged when a tool message is appended
(`is_chat_template_prefix_preserving`, else `get_training_chat_template` must know a patched one). TRL checks the
first and raises mid-construction for the others; `check_tokenizer` checks all three before training, with a fix.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from grpo_pipeline.agents.registry import ToolError, contained_environment, load_environment, resolve_tool
from grpo_pipeline.agents.text_tools import needs_text_loop
from grpo_pipeline.configs.grpo import GRPOStageConfig

TOOL_TEMPLATES = "Qwen2.5/Qwen3 instruct models, Llama 3.1/3.2 instruct"  # a few TRL can parse (docs/agents.md)


def agent_args(cfg: GRPOStageConfig) -> dict[str, Any]:
    """GRPOConfig fields for tool use: the turn limit (TRL's default, None, is no limit at all)."""
    return {"max_tool_calling_iterations": cfg.max_tool_turns} if cfg.sampling.uses_tools else {}


def trainer_agent_kwargs(cfg: GRPOStageConfig, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """GRPOTrainer keyword arguments for tool use: `tools=` (resolved, checked, user tools contained) and
    `environment_factory=` (the environment class, its tool methods contained); {} without tools. Raises ToolError
    naming the field and the fix; may set a response template on `tokenizer` (as TRL itself would). {} as well for
    tools on a model whose chat template cannot carry tool calls: they are called in text (agents/text_tools.py)."""
    if not cfg.sampling.uses_tools or (cfg.environment is None and needs_text_loop(tokenizer)):
        return {}
    kwargs: dict[str, Any] = {}
    if cfg.tools:
        kwargs["tools"] = [
            resolve_tool(name, f"grpo.tools[{i}]", cfg.tool_params.get(name)) for i, name in enumerate(cfg.tools)
        ]
    if cfg.environment is not None:
        kwargs["environment_factory"] = contained_environment(load_environment(cfg.environment))
    check_tokenizer(tokenizer)
    return kwargs


def check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise ToolError unless TRL can run tool calls through `tokenizer`'s chat template (see the module docstring);
    sets TRL's response template for the templates it knows, where none is set."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    model = getattr(tokenizer, "name_or_path", "") or "the model"
    fix = f"use a model whose chat template carries tool calls ({TOOL_TEMPLATES}), or leave grpo.tools empty"
    if not supports_tool_calling(tokenizer):
        raise ToolError(
            f"grpo.tools: the chat template of {model} cannot carry tool calls (it has none, or it drops the "
            f"assistant's tool_calls or the tool messages); {fix}"
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError:
            raise ToolError(
                f"grpo.tools: TRL cannot parse tool calls out of {model}'s completions: its tokenizer has no "
                f"response_template and TRL knows none for its chat template; set one on the tokenizer "
                f"(transformers' chat response parsing docs) or {fix}"
            ) from None
    if not is_chat_template_prefix_preserving(tokenizer):
        try:
            get_training_chat_template(tokenizer)
        except ValueError:
            raise ToolError(
                f"grpo.tools: {model}'s chat template renders earlier turns differently once a tool result follows, "
                f"and TRL has no patched version of it; {fix}"
            ) from None


def check_agent_config(cfg: GRPOStageConfig) -> list[str]:
    """Every problem of the tool settings that shows without a model (for preflight): unknown or unimportable tools,
    tools TRL cannot describe, tool params a tool refuses (the python tool's `isolation: bwrap` without bubblewrap),
    an environment without reset or tools."""
    problems = []
    for i, name in enumerate(cfg.tools):
        try:
            resolve_tool(name, f"grpo.tools[{i}]", cfg.tool_params.get(name))
        except ToolError as e:
            problems.append(str(e))
    if cfg.environment is not None:
        try:
            load_environment(cfg.environment)
        except ToolError as e:
            problems.append(str(e))
    return problems
