"""Dense rewards for tasks whose answer is an integer (the synthetic arithmetic task).

Exact-match correctness is sparse: when a policy solves a prompt never (or always), every completion in its group
gets the same reward, the group-relative advantage (r - mean) / std is zero and the prompt teaches nothing
(DAPO, Yu et al. 2025, sec. 3.2, "dynamic sampling"). Partial credit per correct digit separates "off by one digit"
from "nonsense", so more groups carry signal.
"""

from __future__ import annotations

import re

from grpo_pipeline.rewards.registry import RewardFn, register
from grpo_pipeline.tasks.core.chat import completion_text

_INTEGER = re.compile(r"-?\d+")


def digit_match_score(predicted: str, gold: str) -> float:
    """Fraction of digit positions that agree, aligned from the units digit, over the longer of the two numbers.

    Exact match scores 1.0; a wrong length costs the missing or extra positions ("55" vs "155" is 2/3); a sign
    mismatch or a non-integer scores 0.0. Aligning from the right keeps each digit's place value, so a carry error
    in the tens costs one position, not all of them.
    """
    p, g = predicted.strip(), gold.strip()
    if not _INTEGER.fullmatch(p) or not _INTEGER.fullmatch(g):
        return 0.0
    if p.startswith("-") != g.startswith("-"):
        return 0.0
    p, g = p.lstrip("-"), g.lstrip("-")
    same = sum(a == b for a, b in zip(reversed(p), reversed(g), strict=False))  # lengths may differ
    return same / max(len(p), len(g))


@register("digit_match")
def digit_match_reward() -> RewardFn:
    """Partial credit in [0, 1]: `digit_match_score` of the completion (stripped) against the `answer` column.

    The whole completion must be the integer; text around it scores 0.0, so this reward also enforces the format.
    """

    def digit_match(prompts, completions, answer, **kwargs) -> list[float | None]:
        return [digit_match_score(completion_text(c), str(gold)) for c, gold in zip(completions, answer, strict=True)]

    return digit_match
