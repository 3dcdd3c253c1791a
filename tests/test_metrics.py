import itertools
import math
import random

import pytest

from grpo_pipeline.rewards.math import answer_key
from grpo_pipeline.tasks.scoring.metrics import (
    bootstrap_ci,
    majority_correct,
    mean_pass_at_k,
    paired_bootstrap_ci,
    pass_at_k,
)


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


def test_majority_vote_takes_the_most_frequent_answer_and_breaks_ties_by_first_seen():
    keys = ["5", "7", "7", "5", None]
    correct = [True, False, False, True, False]
    assert majority_correct(keys, correct, 3) is False  # 7 twice beats 5 once
    assert majority_correct(keys, correct, 4) is True  # 5 and 7 tied: 5 was seen first
    assert majority_correct([None, None], [False, False], 2) is False  # nobody voted
    with pytest.raises(ValueError):
        majority_correct(keys, correct, 6)


def test_answer_keys_put_equal_answers_in_one_vote():
    assert answer_key("18") == answer_key("18.0") == answer_key("The answer is 18.") == answer_key("#### 18")
    assert answer_key("1,000") == answer_key("1000")
    assert answer_key(r"so \boxed{\frac{1}{2}}") == answer_key(r"\boxed{ \frac{1}{2} }") != answer_key("2")
    assert answer_key("<answer>42</answer> then 7") == "42"
    assert answer_key("   ") is None


def test_bootstrap_ci_brackets_the_mean_and_shrinks_with_n():
    rng = random.Random(1)
    small = [int(rng.random() < 0.7) for _ in range(50)]
    large = [int(rng.random() < 0.7) for _ in range(2000)]
    lo_s, hi_s = bootstrap_ci(small, n_boot=2000)
    lo_l, hi_l = bootstrap_ci(large, n_boot=2000)
    assert lo_s <= sum(small) / 50 <= hi_s and lo_l <= sum(large) / 2000 <= hi_l
    assert hi_l - lo_l < (hi_s - lo_s) / 3
    assert bootstrap_ci([1, 1, 1]) == (1.0, 1.0)


def test_resampling_in_blocks_draws_the_same_resamples_as_at_once():
    import numpy as np

    from grpo_pipeline.tasks.scoring.metrics import resampled_means

    values = np.random.default_rng(3).random(37)
    whole = resampled_means(values, 500, seed=5, max_draws=10**9)
    blocks = resampled_means(values, 500, seed=5, max_draws=37 * 7)  # 7 resamples per block
    assert np.allclose(whole, blocks)
