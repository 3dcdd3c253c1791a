"""Pure evaluation math: unbiased pass@k (also over the scored samples only), maj@k and bootstrap confidence
intervals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `c` correct out of `n` samples (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), computed as the stable product
    1 - prod_{i=n-c+1}^{n} (1 - k / i) to avoid huge binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def scored_pass_at_k(correct: Sequence[bool | None], k: int) -> float | None:
    """pass@k for one problem over its scored samples only: with c correct among the n' samples that have a score
    (None: the scorer could not judge it), pass_at_k(n', c, k) when n' >= k, else None (too few scored samples to
    estimate pass@k for this problem). Unscored samples are left out rather than counted as wrong; the estimator
    stays unbiased when scoring fails independently of correctness."""
    scored = [bool(x) for x in correct if x is not None]
    return pass_at_k(len(scored), sum(scored), k) if len(scored) >= k else None


def mean_pass_at_k(correct_counts: list[int], n: int, k: int) -> float:
    """pass@k averaged over problems."""
    if not correct_counts:
        raise ValueError("no problems to score")
    return float(np.mean([pass_at_k(n, c, k) for c in correct_counts]))


def paired_bootstrap_ci(
    before: list[float], after: list[float], n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of (after - before) over the same problems and its (1-alpha) percentile bootstrap interval.

    Problems are resampled with replacement, keeping each problem's pair together (Efron & Tibshirani 1993,
    ch. 13), so the interval reflects the per-problem correlation of the two models.
    """
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"need two equal, non-empty lists; got {a.size} and {b.size}")
    diff = b - a
    low, high = np.quantile(resampled_means(diff, n_boot, seed), [alpha / 2, 1 - alpha / 2])
    return float(diff.mean()), float(low), float(high)


def resampled_means(values: np.ndarray, n_boot: int, seed: int, max_draws: int = 2_000_000) -> np.ndarray:
    """The means of `n_boot` resamples of `values` with replacement, drawn a block at a time so that a large eval
    set (10,000 items x 10,000 resamples) never holds more than `max_draws` indices in memory."""
    rng = np.random.default_rng(seed)
    rows = max(1, max_draws // values.size)
    means = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        block = min(rows, n_boot - start)
        means[start : start + block] = values[rng.integers(0, values.size, size=(block, values.size))].mean(axis=1)
    return means


def bootstrap_ci(values: list[float], n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap (1-alpha) interval of the mean of `values` (one score per problem)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values to bootstrap")
    low, high = np.quantile(resampled_means(x, n_boot, seed), [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def majority_correct(keys: list[str | None], correct: Sequence[bool | None], k: int) -> bool | None:
    """maj@k for one problem: the majority answer among the first `k` samples, and whether it is right.

    `keys[i]` is sample i's extracted final answer in a canonical form (None: no answer, no vote); ties go to the
    answer seen first. The majority is right when its first scored sample (`correct[i]` not None) was judged correct;
    None when none of the samples that voted for it has a score. No answer at all is a wrong answer (False).
    Self-consistency voting, Wang et al. 2023 ("Self-Consistency Improves Chain of Thought Reasoning"); maj@k as in
    Lewkowycz et al. 2022.
    """
    if not 1 <= k <= len(keys):
        raise ValueError(f"need 1 <= k <= {len(keys)} samples, got k={k}")
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, key in enumerate(keys[:k]):
        if key is not None:
            votes[key] = votes.get(key, 0) + 1
            first.setdefault(key, i)
    if not votes:
        return False
    winner = max(votes, key=lambda key: (votes[key], -first[key]))
    verdicts = [correct[i] for i in range(k) if keys[i] == winner and correct[i] is not None]
    return bool(verdicts[0]) if verdicts else None
