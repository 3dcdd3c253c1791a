"""Length-shaped rewards: length penalty, cosine-scaled length, n-gram repetition, soft overlong punishment.

Lengths are measured in `unit`: "tokens" (TRL passes `completion_ids` to every reward), "chars" or "words";
"auto" uses tokens when `completion_ids` are given and characters otherwise (e.g. `rewards score`). Training and
evaluation both pass them (tasks/scoring/generation.py cuts the generated tokens up to and including the first EOS, as
TRL's GRPOTrainer does), so a completion gets the same length, and the same score, in both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from grpo_pipeline.rewards.math import math_scores
from grpo_pipeline.rewards.registry import RewardFn, register
from grpo_pipeline.tasks.core.chat import completion_text

Unit = Literal["auto", "tokens", "chars", "words"]


def lengths(texts: Sequence[str], unit: Unit, completion_ids: Sequence[Sequence[int]] | None) -> list[int]:
    """Length of each completion in `unit`."""
    if unit == "tokens" or (unit == "auto" and completion_ids is not None):
        if completion_ids is None:
            raise ValueError("unit='tokens' needs `completion_ids` (TRL passes them); use unit='chars' offline")
        return [len(ids) for ids in completion_ids]
    if unit == "words":
        return [len(t.split()) for t in texts]
    return [len(t) for t in texts]


def _correct(texts: list[str], answer: Sequence[Any] | None) -> list[bool]:
    if answer is None:
        return [True] * len(texts)
    return [s == 1.0 for s in math_scores(texts, [str(a) for a in answer])]


@register("length")
def length_reward(unit: Unit = "auto") -> RewardFn:
    """Kimi k1.5 length penalty (Kimi Team 2025, sec. 2.3.3), within each group of completions of one prompt:
    lambda = 0.5 - (len - min_len) / (max_len - min_len); correct completions get lambda, wrong ones min(0, lambda).
    Correctness comes from the `answer` column (math-verify); without it every completion counts as correct."""

    def length(prompts, completions, answer=None, completion_ids=None, **kwargs) -> list[float | None]:
        texts = [completion_text(c) for c in completions]
        sizes = lengths(texts, unit, completion_ids)
        correct = _correct(texts, answer)
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(repr(p), []).append(i)
        scores: list[float | None] = [0.0] * len(texts)
        for members in groups.values():
            lo, hi = min(sizes[i] for i in members), max(sizes[i] for i in members)
            if hi == lo:
                continue  # all the same length: no signal
            for i in members:
                lam = 0.5 - (sizes[i] - lo) / (hi - lo)
                scores[i] = lam if correct[i] else min(0.0, lam)
        return scores

    return length


@register("cosine_length")
def cosine_length_reward(
    max_len: int = 1000,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    unit: Unit = "auto",
) -> RewardFn:
    """Cosine-scaled length reward (Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning", eq. 1):
    r = min + (max - min) * (1 + cos(pi * len / max_len)) / 2, so short correct answers score near
    `max_value_correct` and long wrong ones are punished less than short wrong ones (they may still be thinking).
    Correctness comes from the `answer` column (math-verify)."""

    def cosine_length(prompts, completions, answer=None, completion_ids=None, **kwargs) -> list[float | None]:
        texts = [completion_text(c) for c in completions]
        sizes = lengths(texts, unit, completion_ids)
        scores: list[float | None] = []
        for size, ok in zip(sizes, _correct(texts, answer), strict=True):
            cosine = math.cos(min(size, max_len) / max_len * math.pi)
            lo, hi = (min_value_correct, max_value_correct) if ok else (max_value_wrong, min_value_wrong)
            scores.append(lo + 0.5 * (hi - lo) * (1.0 + cosine))
        return scores

    return cosine_length


def repetition_score(text: str, ngram_size: int, max_penalty: float) -> float:
    """max_penalty * (1 - unique n-grams / n-grams) over lower-cased words; 0 for texts shorter than one n-gram."""
    words = text.lower().split()
    if len(words) < ngram_size:
        return 0.0
    ngrams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    return max_penalty * (1.0 - len(set(ngrams)) / len(ngrams)) + 0.0  # + 0.0: no -0.0


@register("repetition_penalty")
def repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> RewardFn:
    """N-gram repetition penalty (Yeo et al. 2025, sec. 4.2; open-r1): 0 for no repeated n-gram, down to
    `max_penalty` (negative) when one n-gram is repeated throughout."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty must be <= 0 (it is a penalty), got {max_penalty}")

    def repetition_penalty(prompts, completions, **kwargs) -> list[float | None]:
        return [repetition_score(completion_text(c), ngram_size, max_penalty) for c in completions]

    return repetition_penalty


@register("overlong")
def overlong_reward(max_len: int = 1024, cache_len: int = 256, unit: Unit = "auto") -> RewardFn:
    """Soft overlong punishment (DAPO, Yu et al. 2025, eq. 13): 0 up to max_len - cache_len, then linearly down to
    -1 at max_len, and -1 beyond. Set max_len to the generation limit (grpo.max_completion_tokens)."""
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")

    def overlong(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
        sizes = lengths([completion_text(c) for c in completions], unit, completion_ids)
        out: list[float | None] = []
        for size in sizes:
            if size <= max_len - cache_len:
                out.append(0.0)
            elif size <= max_len:
                out.append((max_len - cache_len - size) / cache_len)
            else:
                out.append(-1.0)
        return out

    return overlong
