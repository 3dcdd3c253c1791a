"""Answer correctness for tasks with a final answer (arithmetic, GSM8K-style word problems)."""

from __future__ import annotations

import re
from fractions import Fraction

from rewards.registry import RewardFn, completion_text, register

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HASHES = re.compile(r"####\s*(.+)$", re.MULTILINE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer in a completion: `<answer>` tags, then `\\boxed{}`, then `#### N`, then the last number."""
    for pattern in (_ANSWER_TAG, _BOXED, _HASHES):
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, gold: str) -> bool:
    """Numeric equality when both parse as numbers, else whitespace-insensitive string equality."""
    if predicted is None:
        return False
    p, g = _as_number(predicted), _as_number(gold)
    if p is not None and g is not None:
        return p == g
    return predicted.strip() == gold.strip()


@register("correctness")
def correctness_reward() -> RewardFn:
    """1.0 when the completion's final answer equals the `answer` column, else 0.0."""

    def correctness(prompts, completions, answer, **kwargs) -> list[float | None]:
        return [
            1.0 if answers_match(extract_answer(completion_text(c)), str(gold)) else 0.0
            for c, gold in zip(completions, answer, strict=True)
        ]

    return correctness
