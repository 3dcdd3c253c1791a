"""Whether a GRPO round returns the step its probe chose or its start (`grpo.keep_over_start`): the statistics.

Two rules (`grpo.keep_rule`):

- `confirm` (the default). The probe rows are split once, by a seeded permutation (`halves`), into a choosing half
  and a confirming half. The round's candidate is the step with the best accuracy on the choosing half (ties to the
  later step, the start included: `choose_later`). It replaces the start only when, on the confirming half (rows
  that took no part in choosing it), it got more rows right where the start got them wrong than the reverse, by more
  than `grpo.keep_margin` of the rows both scored (`paired_counts`, `confirms`).
- `ci` (the rule before it). The candidate is chosen on every probe row and kept only when the paired bootstrap 95%
  CI of its gain over the start, on those same rows, is above zero (`probe.beats_start`).

Why `confirm`: the candidate is the best of K noisy estimates, so its estimate on the rows that chose it is biased
upwards (the winner's curse: with K=5 probes of a step truly 3 points worse than the start, "better on the same
rows" keeps it 45% of the time on 128 rows, "better on the other half" 17%); and a 95% CI above zero on 128 rows sees
a +3-point gain about one time in four, so `ci` returns the start after most real gains. The confirming half is an
unbiased test of one fixed step, and its point decision (gain above the margin) is what maximises the expected
accuracy of the returned policy when a gain and a loss are a priori equally likely. benchmarks/keep_rule.py
simulates both rules (false keeps of worse steps, false discards of better ones); benchmarks/LEARNING.md has the
table.

Everything here is pure: lists or numpy arrays in (1.0 right, 0.0 wrong, None or NaN unscored), numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SPLIT_SEED = 0  # the probe rows' split into halves: fixed, so that every round and every process splits alike


def as_items(items: Sequence[float | None] | np.ndarray) -> np.ndarray:
    """Per-row correctness as floats, an unscored row (None) as NaN."""
    if isinstance(items, np.ndarray):
        return items.astype(float, copy=False)
    return np.array([math.nan if v is None else float(v) for v in items], dtype=float)


def halves(n: int, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The row indices 0..n-1 split into (choosing half, confirming half) by a seeded permutation, each in increasing
    order; the confirming half takes the odd row."""
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[: n // 2]), np.sort(order[n // 2 :])


def scored_mean(items: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray | float:
    """Accuracy over the scored entries of `items` (last axis: rows), on `rows` only when given; NaN where none is
    scored."""
    x = items if rows is None else items[..., rows]
    scored = (~np.isnan(x)).sum(axis=-1)
    total = np.nansum(x, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(scored > 0, total / np.maximum(scored, 1), np.nan)
    return float(mean) if np.ndim(mean) == 0 else mean


def choose_later(scores: np.ndarray) -> np.ndarray | int:
    """The index along axis 0 of the highest score, ties to the later index; NaN scores are never chosen (index 0
    when every score is NaN). `scores[0]` is the start's, so 0 means no step scored at least as well as the start.

    The probe applies the same rule one probe at a time (a step replaces the candidate when its score is at least
    the candidate's): tests/test_keep_rule.py checks that both agree."""
    s = np.where(np.isnan(scores), -np.inf, scores)
    last = s.shape[0] - 1 - np.argmax(s[::-1], axis=0)
    chosen = np.where(np.isneginf(s.max(axis=0)), 0, last)
    return int(chosen) if np.ndim(chosen) == 0 else chosen


@dataclass(frozen=True)
class PairedCounts:
    """A step against the start on the same rows: `wins` rows the step got right and the start wrong, `losses` the
    reverse, out of `rows` rows both scored."""

    wins: int
    losses: int
    rows: int

    @property
    def gain(self) -> float:
        """The step's accuracy minus the start's on those rows (NaN without any)."""
        return (self.wins - self.losses) / self.rows if self.rows else math.nan


def paired_counts(start: np.ndarray, step: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """(wins, losses, rows both scored) of `step` against `start` over the last axis (on `rows` only when given);
    leading axes broadcast, so a simulation passes (trials, n) arrays."""
    a, b = (start, step) if rows is None else (start[..., rows], step[..., rows])
    both = ~np.isnan(a) & ~np.isnan(b)
    wins = (both & (b >= 1.0) & (a < 1.0)).sum(axis=-1)
    losses = (both & (a >= 1.0) & (b < 1.0)).sum(axis=-1)
    return wins, losses, both.sum(axis=-1)


def counts(start: Sequence[float | None], step: Sequence[float | None], rows: np.ndarray | None = None) -> PairedCounts:
    """`paired_counts` of two probe results (lists, None unscored)."""
    wins, losses, both = paired_counts(as_items(start), as_items(step), rows)
    return PairedCounts(int(wins), int(losses), int(both))


def confirms(wins: np.ndarray | int, losses: np.ndarray | int, rows: np.ndarray | int, margin: float = 0.0):
    """The confirm rule's decision: the step's gain (wins - losses) / rows is above `margin` (a fraction: 0.01 is one
    point); never without a row both scored. Broadcasts over arrays."""
    wins, losses, rows = np.asarray(wins), np.asarray(losses), np.asarray(rows)
    # compared as (wins - losses) > margin * rows: no division, so a margin of 0 is decided in integers
    keep = (rows > 0) & ((wins - losses) > margin * rows)
    return bool(keep) if keep.ndim == 0 else keep


def keep_probability(m: int, p_win: float, p_loss: float, margin: float = 0.0) -> float:
    """The exact chance that the confirm rule keeps one fixed step on `m` confirming rows, each independently a win
    with probability `p_win`, a loss with `p_loss`, else a tie: P(W - L > margin * m) for (W, L, m - W - L) ~
    Multinomial(m; p_win, p_loss, 1 - p_win - p_loss)."""
    if m <= 0:
        return 0.0
    p_tie = 1.0 - p_win - p_loss
    if min(p_win, p_loss) < 0 or p_tie < -1e-12:
        raise ValueError(f"p_win={p_win} and p_loss={p_loss} are not probabilities of disjoint outcomes")
    w, loss = np.meshgrid(np.arange(m + 1), np.arange(m + 1), indexing="ij")
    tie = m - w - loss
    ok = (tie >= 0) & ((w - loss) > margin * m)
    logs = {"w": p_win, "l": p_loss, "t": max(p_tie, 0.0)}
    with np.errstate(divide="ignore"):
        log_p = {k: np.log(v) if v > 0 else -np.inf for k, v in logs.items()}
    tie_c = np.where(ok, tie, 0)
    lf = log_factorials(m)
    log_pmf = (
        lf[m] - lf[w] - lf[loss] - lf[tie_c]
        + _times(w, log_p["w"]) + _times(loss, log_p["l"]) + _times(tie_c, log_p["t"])
    )  # fmt: skip
    return float(np.exp(log_pmf[ok]).sum())


def log_factorials(n: int) -> np.ndarray:
    """log(k!) for k = 0..n."""
    return np.array([math.lgamma(k + 1) for k in range(n + 1)])


def _times(count: np.ndarray, log_p: float) -> np.ndarray:
    """count * log_p with 0 * log(0) = 0 (an outcome of probability 0 that does not occur)."""
    return np.multiply(count, log_p, out=np.zeros(count.shape), where=count > 0)


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test (McNemar's exact test): the chance of `wins` or more wins among the `wins + losses`
    rows where step and start differ, if each such row were a win or a loss with probability 1/2 (a step no better
    than its start). 1.0 without a differing row."""
    n = wins + losses
    if n == 0:
        return 1.0
    k, lf = np.arange(wins, n + 1), log_factorials(n)
    log_terms = lf[n] - lf[k] - lf[n - k] - n * math.log(2)
    return float(min(1.0, np.exp(log_terms).sum()))
