"""Prompts and what must follow them, in tokens, against the model's context window: for the preflight
(tasks/preflight.check_inputs), which refuses rows too long for the model before anything trains.

A prompt counts as the model reads it (a chat prompt rendered with the chat template, BOS and the like included), and
it must fit in the context together with each of what follows it: GRPO's rollouts (grpo.max_completion_tokens, on the
training rows and the probe's eval rows), evaluation's completions (eval.max_new_tokens) and, with SFT, each training
row's own completion and EOS. Each message names the rows, the longest, what overruns and the fields that fix it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from grpo_pipeline.configs.schema import EvalConfig, GRPOStageConfig
from grpo_pipeline.tasks.core.chat import ChatTemplateError, render_prompt
from grpo_pipeline.tasks.core.common import Checkpoint, load_tokenizer, logger

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

# Config attributes that hold a model's longest sequence, most common first.
CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
# Rows named in one message; the rest are counted.
SHOWN_ROWS = 5


def model_context(config: PretrainedConfig) -> tuple[int, str] | None:
    """The longest sequence the model takes and the config attribute that says so, when it says."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in CONTEXT_ATTRIBUTES:
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value, attr
    return None


def context_problems(
    base: Checkpoint,
    train: pd.DataFrame,
    held_out: pd.DataFrame,
    grpo: GRPOStageConfig,
    eval_cfg: EvalConfig,
    sft_enabled: bool,
) -> tuple[list[str], int | None, int]:
    """Rows too long for the model's context: prompts longer than it, then prompts that fit but leave too little
    room for what follows them (rollouts, evaluation, the SFT target). Returns the problems, the context and the
    longest prompt in tokens."""
    from transformers import AutoConfig

    name = base.parent or base.path
    try:
        config = AutoConfig.from_pretrained(base.path)
        tokenizer = load_tokenizer(base.path)
    except (OSError, ValueError) as e:
        return [f"model.base {name!r} cannot be loaded from {base.path}: {e}"], None, 0
    # A chat prompt (data.prompt_format: chat) counts as the model reads it: rendered with the chat template.
    try:
        texts = {
            split: pd.Series([render_prompt(tokenizer, p) for p in rows["prompt"]], dtype=object)
            for split, rows in (("train", train), ("eval", held_out))
        }
    except ChatTemplateError as e:
        return [f"model.base {name!r}: {e}"], None, 0
    prompts = {"train": _token_counts(tokenizer, texts["train"]), "eval": _token_counts(tokenizer, texts["eval"])}
    longest = max([*prompts["train"], *prompts["eval"]], default=0)
    found = model_context(config)
    if found is None:
        logger.warning("model.base %s does not say how long its context is; prompt lengths are not checked", name)
        return [], None, longest
    context, attr = found
    lengths = _PromptLengths(texts, prompts, context, f"model.base {name!r} takes {context} tokens ({attr})")
    budgets = _completion_budgets(tokenizer, train, held_out, grpo, eval_cfg, sft_enabled)
    return lengths.problems(budgets), context, longest


def _completion_budgets(
    tokenizer: PreTrainedTokenizerBase,
    train: pd.DataFrame,
    held_out: pd.DataFrame,
    grpo: GRPOStageConfig,
    eval_cfg: EvalConfig,
    sft_enabled: bool,
) -> dict[str, dict[str, list[int]]]:
    """What must fit after each prompt, by what sets it: {budget: {split: tokens per row}}."""
    probe = min(grpo.probe_problems, len(held_out))  # the probe generates rollouts' length on these eval rows
    budgets = {
        f"grpo.max_completion_tokens={grpo.max_completion_tokens}": {
            "train": [grpo.max_completion_tokens] * len(train),
            "eval": [grpo.max_completion_tokens] * probe,
        },
        f"eval.max_new_tokens={eval_cfg.max_new_tokens}": {"eval": [eval_cfg.max_new_tokens] * len(held_out)},
    }
    if sft_enabled:  # SFT trains on prompt + completion + EOS
        budgets["their SFT completion (data.completion_column) and EOS"] = {
            "train": [n + 1 for n in _token_counts(tokenizer, train["completion"], special=False)]
        }
    return budgets


class _PromptLengths:
    """The prompts of both splits in tokens against the model's context, and the messages for those that overrun."""

    SHORTEN = "shorten the prompts (data.prompt_template, or data.max_prompt_chars to reject long rows)"
    LONGER = "use a model with a longer context (model.tiny.max_positions for the tiny model)"

    def __init__(self, texts: dict[str, pd.Series], prompts: dict[str, list[int]], context: int, model: str) -> None:
        self.texts, self.prompts, self.context, self.model = texts, prompts, context, model

    def problems(self, budgets: dict[str, dict[str, list[int]]]) -> list[str]:
        """Prompts longer than the context, then, per budget, prompts that fit alone but not with the budget."""
        problems = []
        too_long = [(s, i, n) for s, counts in self.prompts.items() for i, n in enumerate(counts) if n > self.context]
        if too_long:
            problems.append(
                self.describe(too_long, "have a prompt longer than the model's context")
                + f". Fix: {self.SHORTEN}, or {self.LONGER}"
            )
        for budget, extra in budgets.items():
            if over := self.rows_over(extra):
                fix = f"lower {budget.split('=')[0]}" if "=" in budget else "shorten the SFT completions"
                problems.append(
                    self.describe(over, f"leave too little room for {budget}")
                    + f". Fix: {fix}, {self.SHORTEN}, or {self.LONGER}"
                )
        return problems

    def rows_over(self, extra: dict[str, list[int]]) -> list[tuple[str, int, int]]:
        """(split, row, tokens needed) of the rows whose prompt fits but prompt + extra does not."""
        return [
            (split, i, n + more)
            for split, counts in extra.items()
            for i, (n, more) in enumerate(zip(self.prompts[split], counts, strict=False))
            if n <= self.context < n + more
        ]

    def describe(self, over: list[tuple[str, int, int]], what: str) -> str:
        split, row, needed = max(over, key=lambda o: o[2])
        shown = ", ".join(f"{s} row {i}" for s, i, _ in over[:SHOWN_ROWS])
        more = f" and {len(over) - SHOWN_ROWS} more" if len(over) > SHOWN_ROWS else ""
        prompt = str(self.texts[split].iloc[row])[:60]
        return (
            f"{len(over)} row(s) {what}: {self.model}, and the longest, {split} row {row}, needs {needed} "
            f"({self.prompts[split][row]} in its prompt {prompt!r}); {shown}{more}"
        )


def _token_counts(tokenizer: PreTrainedTokenizerBase, texts: pd.Series, special: bool = True) -> list[int]:
    """Tokens per text; with `special`, as the trainers encode a prompt (BOS and the like included)."""
    if texts.empty:
        return []
    return [len(ids) for ids in tokenizer([str(t) for t in texts], add_special_tokens=special)["input_ids"]]
