"""Format rewards: does the completion have the shape the task asks for?

The XML layout `<reasoning>...</reasoning><answer>...</answer>` is the one of common GRPO recipes (e.g. the GSM8K
GRPO demo by W. Brown, and open-r1's `<think>` variant); tags are parameters, so `think` works too.
"""

from __future__ import annotations

import re

from grpo_pipeline.rewards.registry import RewardFn, register
from grpo_pipeline.tasks.core.chat import completion_text

XML_PATTERN = r"^\s*<reasoning>.*?</reasoning>\s*<answer>.*?</answer>\s*$"


@register("format")
def format_reward(pattern: str = XML_PATTERN) -> RewardFn:
    """1.0 when the whole completion matches `pattern` (a regex, DOTALL), else 0.0.

    The default is the `<reasoning>...</reasoning><answer>...</answer>` layout of common GRPO recipes; the tiny
    arithmetic recipe asks for a bare integer (`^-?\\d+$`).
    """
    regex = re.compile(pattern, re.DOTALL)

    def format(prompts, completions, **kwargs) -> list[float | None]:
        return [1.0 if regex.fullmatch(completion_text(c)) else 0.0 for c in completions]

    return format


@register("format_strict")
def strict_format_reward(reasoning_tag: str = "reasoning", answer_tag: str = "answer") -> RewardFn:
    """1.0 for exactly `<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>` (optional final newline).

    Each tag on its own line and nothing before or after: the strict variant of the GSM8K GRPO demo recipe.
    """
    r, a = re.escape(reasoning_tag), re.escape(answer_tag)
    regex = re.compile(rf"<{r}>\n.*?\n</{r}>\n<{a}>\n.*?\n</{a}>\n?", re.DOTALL)

    def format_strict(prompts, completions, **kwargs) -> list[float | None]:
        return [1.0 if regex.fullmatch(completion_text(c)) else 0.0 for c in completions]

    return format_strict


@register("format_soft")
def soft_format_reward(reasoning_tag: str = "reasoning", answer_tag: str = "answer") -> RewardFn:
    """1.0 when a `<reasoning>...</reasoning>` block is followed by an `<answer>...</answer>` block anywhere.

    Any whitespace and line layout is accepted, and text may surround the blocks.
    """
    r, a = re.escape(reasoning_tag), re.escape(answer_tag)
    regex = re.compile(rf"<{r}>.*?</{r}>\s*<{a}>.*?</{a}>", re.DOTALL)

    def format_soft(prompts, completions, **kwargs) -> list[float | None]:
        return [1.0 if regex.search(completion_text(c)) else 0.0 for c in completions]

    return format_soft


def tag_count_score(text: str, reasoning_tag: str, answer_tag: str, penalty_per_char: float) -> float:
    """0.25 for each of the four tags that appears exactly once, minus `penalty_per_char` per character after the
    closing answer tag (the `count_xml` reward of the GSM8K GRPO demo, with partial credit per tag)."""
    tags = (f"<{reasoning_tag}>", f"</{reasoning_tag}>", f"<{answer_tag}>", f"</{answer_tag}>")
    score = sum(0.25 for t in tags if text.count(t) == 1)
    closing = text.rfind(tags[3])
    if closing >= 0:
        trailing = text[closing + len(tags[3]) :].strip()
        score -= penalty_per_char * len(trailing)
    return score


@register("tag_count")
def tag_count_reward(
    reasoning_tag: str = "reasoning", answer_tag: str = "answer", penalty_per_char: float = 0.001
) -> RewardFn:
    """Incremental format reward: 0.25 per XML tag present exactly once (up to 1.0), minus a penalty per character
    of text after `</answer>`. Denser than the all-or-nothing format rewards early in training."""

    def tag_count(prompts, completions, **kwargs) -> list[float | None]:
        return [tag_count_score(completion_text(c), reasoning_tag, answer_tag, penalty_per_char) for c in completions]

    return tag_count
