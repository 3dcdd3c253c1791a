"""Format rewards: does the completion have the shape the task asks for?"""

from __future__ import annotations

import re

from rewards.registry import RewardFn, completion_text, register

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
