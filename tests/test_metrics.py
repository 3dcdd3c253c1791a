import itertools
import math
import random

import pytest

from grpo_pipeline.tasks.metrics import mean_pass_at_k, paired_bootstrap_ci, pass_at_k


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (c correct) that contain at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_form_for_large_n():
    # 1 - C(n-c, k)/C(n, k) with exact integers
    n, c, k = 200, 13, 10
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)


def test_pass_at_1_is_fraction_correct():
    assert mean_pass_at_k([0, 3, 8], n=8, k=1) == pytest.approx((0 + 3 / 8 + 1) / 3)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_paired_bootstrap_ci_contains_true_difference_and_detects_no_change():
    rng = random.Random(0)
    before = [int(rng.random() < 0.5) for _ in range(600)]
    after = [1 if b else int(rng.random() < 0.4) for b in before]  # strictly better on ~20 points
    diff, low, high = paired_bootstrap_ci(before, after, n_boot=2000)
    assert low < diff < high
    assert low > 0.1 and high < 0.3
    same, low0, high0 = paired_bootstrap_ci(before, before, n_boot=500)
    assert same == 0 and low0 == 0 and high0 == 0
