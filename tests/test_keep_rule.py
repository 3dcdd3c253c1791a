"""The keep rule's statistics (tasks/training/keep_rule.py) against brute force: every function on dense grids or many
random cases, each compared with the plainest loop or enumeration that computes the same thing."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from grpo_pipeline.tasks.training.keep_rule import (
    PairedCounts,
    as_items,
    choose_later,
    confirms,
    counts,
    halves,
    keep_probability,
    paired_counts,
    scored_mean,
    sign_test_p,
)


def random_items(rng: np.random.Generator, shape: tuple[int, ...], unscored: float = 0.1) -> np.ndarray:
    items = (rng.random(shape) < rng.random()).astype(float)
    items[rng.random(shape) < unscored] = np.nan
    return items


@pytest.mark.parametrize("n", [*range(0, 20), 127, 128, 1024])
def test_halves_split_every_row_once_the_same_way_each_time(n):
    choose, confirm = halves(n)
    assert sorted([*choose, *confirm]) == list(range(n))  # a partition of the rows
    assert len(choose) == n // 2 and len(confirm) == n - n // 2
    assert list(choose) == sorted(choose) and list(confirm) == sorted(confirm)
    again = halves(n)
    assert np.array_equal(again[0], choose) and np.array_equal(again[1], confirm)


def test_halves_depend_on_the_seed_only_through_the_permutation():
    assert not np.array_equal(halves(128, seed=0)[0], halves(128, seed=1)[0])


def test_scored_mean_leaves_unscored_rows_out():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(0, 12))
        items = random_items(rng, (n,), unscored=0.3)
        rows = np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)) if n else np.array([], int)
        for subset in (None, rows):
            picked = [items[i] for i in (range(n) if subset is None else subset) if not math.isnan(items[i])]
            expected = sum(picked) / len(picked) if picked else math.nan
            got = scored_mean(items, subset)
            assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def online_choice(scores: list[float]) -> int:
    """The probe's rule, one probe at a time: a step replaces the candidate when its score is at least the
    candidate's (NaN never does), the start (index 0) being the first candidate unless it is NaN."""
    best: int | None = None
    for i, s in enumerate(scores):
        if math.isnan(s):
            continue
        if best is None or s >= scores[best]:
            best = i
    return 0 if best is None else best


def test_choose_later_is_the_probes_online_rule():
    rng = np.random.default_rng(1)
    for _ in range(3000):
        k = int(rng.integers(1, 8))
        scores = rng.integers(0, 4, size=k).astype(float) / 4  # few values: many ties
        scores[rng.random(k) < 0.2] = np.nan
        assert choose_later(scores) == online_choice(list(scores)), scores


def test_choose_later_works_on_many_trials_at_once():
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 3, size=(6, 400)).astype(float)
    scores[rng.random(scores.shape) < 0.1] = np.nan
    assert list(choose_later(scores)) == [online_choice(list(scores[:, t])) for t in range(400)]
    assert choose_later(np.array([np.nan, np.nan])) == 0  # nothing scored: the start


def brute_counts(start: list[float | None], step: list[float | None], rows) -> tuple[int, int, int]:
    wins = losses = both = 0
    for i in rows:
        a, b = start[i], step[i]
        if a is None or b is None:
            continue
        both += 1
        wins += b == 1.0 and a == 0.0
        losses += a == 1.0 and b == 0.0
    return wins, losses, both


def test_paired_counts_match_a_loop_over_the_rows():
    rng = np.random.default_rng(3)
    for _ in range(1000):
        n = int(rng.integers(0, 15))
        start = [None if rng.random() < 0.15 else float(rng.random() < 0.5) for _ in range(n)]
        step = [None if rng.random() < 0.15 else float(rng.random() < 0.6) for _ in range(n)]
        rows = np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)) if n else np.array([], int)
        for subset in (None, rows):
            expected = brute_counts(start, step, range(n) if subset is None else subset)
            got = counts(start, step, subset)
            assert (got.wins, got.losses, got.rows) == expected


def test_paired_counts_broadcast_over_trials():
    rng = np.random.default_rng(4)
    start, step = random_items(rng, (50, 9)), random_items(rng, (50, 9))
    wins, losses, both = paired_counts(start, step)
    for t in range(50):
        listed = [[None if math.isnan(v) else v for v in a[t]] for a in (start, step)]
        assert (wins[t], losses[t], both[t]) == brute_counts(*listed, range(9))


def test_gain_is_the_accuracy_difference_on_the_rows_both_scored():
    assert PairedCounts(5, 2, 10).gain == pytest.approx(0.3)
    assert math.isnan(PairedCounts(0, 0, 0).gain)
    start, step = [1.0, 0.0, 0.0, None, 1.0], [1.0, 1.0, 0.0, 1.0, 0.0]
    c = counts(start, step)
    assert c == PairedCounts(1, 1, 4) and c.gain == 0.0
    assert c.gain == pytest.approx(np.nanmean(as_items(step)[[0, 1, 2, 4]]) - np.nanmean(as_items(start)))


@pytest.mark.parametrize("margin", [Fraction(k, 64) for k in range(-16, 17, 3)])
def test_confirms_is_gain_above_the_margin_exactly(margin):
    for rows in range(0, 13):
        for wins in range(rows + 1):
            for losses in range(rows - wins + 1):
                expected = rows > 0 and Fraction(wins - losses, rows) > margin
                assert confirms(wins, losses, rows, float(margin)) == expected, (wins, losses, rows)


def test_confirms_broadcasts_and_a_tie_is_not_a_gain():
    wins, losses, rows = np.array([3, 2, 0, 4, 4]), np.array([2, 2, 0, 5, 6]), np.array([8, 8, 0, 20, 20])
    assert list(confirms(wins, losses, rows)) == [True, False, False, False, False]
    # non-inferiority: 1 row of 20 worse is within 0.1, 2 are not above it
    assert list(confirms(wins, losses, rows, -0.1)) == [True, True, False, True, False]
    assert confirms(3, 2, 8) is True


def enumerated_keep_probability(m: int, p_win: float, p_loss: float, margin: float) -> float:
    p = {1: p_win, -1: p_loss, 0: 1 - p_win - p_loss}
    total = 0.0
    for outcome in itertools.product((1, -1, 0), repeat=m):
        if Fraction(sum(outcome), m) > Fraction(margin):
            total += math.prod(p[o] for o in outcome)
    return total


@pytest.mark.parametrize("m", range(1, 8))
def test_keep_probability_matches_enumerating_every_outcome(m):
    for p_win, p_loss in [(0.1, 0.1), (0.2, 0.05), (0.05, 0.3), (0.5, 0.5), (0.0, 0.4), (0.3, 0.0), (0.0, 0.0)]:
        for margin in (-0.25, -0.125, 0.0, 0.125, 0.5):
            expected = enumerated_keep_probability(m, p_win, p_loss, margin)
            assert keep_probability(m, p_win, p_loss, margin) == pytest.approx(expected, abs=1e-12)


def test_keep_probability_is_a_probability_and_matches_simulation_on_many_rows():
    assert keep_probability(200, 0.1, 0.1, -1.5) == pytest.approx(1.0)
    assert keep_probability(0, 0.3, 0.1) == 0.0
    rng = np.random.default_rng(5)
    draws = rng.multinomial(256, [0.12, 0.09, 0.79], size=200_000)
    simulated = np.mean(draws[:, 0] - draws[:, 1] > 0)
    assert keep_probability(256, 0.12, 0.09) == pytest.approx(simulated, abs=0.005)
    with pytest.raises(ValueError, match="not probabilities"):
        keep_probability(10, 0.7, 0.5)


@pytest.mark.parametrize("n", range(0, 13))
def test_sign_test_matches_enumerating_every_sign_pattern(n):
    for wins in range(n + 1):
        patterns = list(itertools.product((0, 1), repeat=n))
        expected = sum(sum(p) >= wins for p in patterns) / len(patterns)
        assert sign_test_p(wins, n - wins) == pytest.approx(expected, abs=1e-12)
