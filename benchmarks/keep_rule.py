"""How often does a round's keep decision (`grpo.keep_over_start`) get it wrong? The rule before (`grpo.keep_rule:
ci`) against the default (`confirm`), by simulation; the rules themselves are in tasks/training/keep_rule.py.

The model. A probe of n rows; row i has a difficulty z_i ~ N(0, 1) that every policy shares, and each probed policy
k its own per-row noise e_k,i, which drifts from one probe to the next (an AR(1) with correlation `--step-corr`
between consecutive probes; the start is probe 0). Row i is right for policy k when
sqrt(r) z_i + sqrt(1 - r) e_k,i < Phi^-1(a_k) (r = `--item-corr`), so policy k's true accuracy over the population
of problems is exactly a_k, and the start and a step get correlated rows right (a paired comparison). The round
probes `--probes` steps after its start; their true accuracy drifts from the start's a_0 to a_0 + delta over the
first half of the round and stays there.

The rules, as the probe applies them:
- ci (the rule before): choose the step with the best accuracy on all n rows (ties to the later step, the start
  included); keep it when the percentile bootstrap 95% CI of its paired gain on those rows is above zero (2,000
  resamples, as `probe.beats_start`; resampling rows draws multinomial counts of the three kinds of pair, which is
  how it is simulated here).
- confirm (the default): choose on the choosing half of the rows (`halves`), keep when the gain on the confirming half
  is above `--margin` (0: strictly better).
- same-rows (shown to measure the winner's curse, not offered): choose on all n rows and keep when the gain on those
  same rows is above zero.

Per probe size n and delta, the share of rounds that return a step rather than the start (keep %): with delta < 0
every probed step is truly worse than the start, so that is the false-keep rate; with delta > 0 the chosen step is
truly better, so 100 - keep % is the false-discard rate. And the mean true gain (points) of the policy the round
returns, which weighs both errors by their size. `--check` also compares the simulator with the exact keep
probability of one fixed step (`keep_probability`, no choosing). The last lines are machine-readable, one per n:
  n=<n> ci_false_keep=<at -3> confirm_false_keep=<at -3> ci_false_discard=<at +3> confirm_false_discard=<at +3>

Usage:
  python benchmarks/keep_rule.py                                  # n = 128..1024, 4000 rounds each
  python benchmarks/keep_rule.py --probes 10 --margin -0.01 --check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import multivariate_normal, norm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from grpo_pipeline.tasks.training.keep_rule import (  # noqa: E402
    choose_later,
    confirms,
    halves,
    keep_probability,
    paired_counts,
    scored_mean,
)

RULES = ("ci", "confirm", "same-rows")
BOOT = 2_000  # resamples, as probe.beats_start


def trajectory(a0: float, delta: float, probes: int) -> np.ndarray:
    """True accuracy of the start and each probed step: a0 drifting to a0 + delta over the first half, then flat."""
    return np.array([a0] + [a0 + delta * min(1.0, 2 * k / probes) for k in range(1, probes + 1)])


def simulate(rng, trials: int, n: int, acc: np.ndarray, item_corr: float, step_corr: float) -> np.ndarray:
    """Per-row results (probes + 1, trials, n) as floats, 1.0 right: see the module doc."""
    z = rng.standard_normal((trials, n))
    e = rng.standard_normal((trials, n))
    items = np.empty((len(acc), trials, n), dtype=np.float32)
    for k, a in enumerate(acc):
        if k:
            e = step_corr * e + np.sqrt(1 - step_corr**2) * rng.standard_normal((trials, n))
        items[k] = np.sqrt(item_corr) * z + np.sqrt(1 - item_corr) * e < norm.ppf(a)
    return items


def kept_step(rule: str, items: np.ndarray, rng, margin: float) -> np.ndarray:
    """The index (0: the start) each simulated round returns under `rule`."""
    _, trials, n = items.shape
    everyone = np.arange(trials)
    if rule == "confirm":
        choose, confirm = halves(n)
        chosen = choose_later(scored_mean(items, choose))
        wins, losses, rows = paired_counts(items[0], items[chosen, everyone], confirm)
        keep = confirms(wins, losses, rows, margin)
    else:
        chosen = choose_later(scored_mean(items))
        wins, losses, rows = paired_counts(items[0], items[chosen, everyone])
        if rule == "same-rows":
            keep = confirms(wins, losses, rows)
        else:
            shares = np.stack([wins, losses, rows - wins - losses], axis=1) / rows[:, None]
            draws = rng.multinomial(rows, shares, size=(BOOT, trials))  # (BOOT, trials, 3)
            low = np.quantile((draws[..., 0] - draws[..., 1]) / rows, 0.025, axis=0)
            keep = low > 0
    return np.where(keep & (chosen > 0), chosen, 0)


def measure(args, n: int, delta: float, seed: int) -> dict[str, tuple[float, float]]:
    """Per rule: (keep %, mean true gain of the returned policy in points)."""
    rng = np.random.default_rng(seed)
    acc = trajectory(args.a0, delta, args.probes)
    kept = {rule: [] for rule in RULES}
    for start in range(0, args.trials, args.chunk):
        items = simulate(rng, min(args.chunk, args.trials - start), n, acc, args.item_corr, args.step_corr)
        for rule in RULES:
            kept[rule].append(kept_step(rule, items, rng, args.margin))
    out = {}
    for rule, parts in kept.items():
        k = np.concatenate(parts)
        out[rule] = (100 * float(np.mean(k > 0)), 100 * float(np.mean(acc[k] - acc[0])))
    return out


def exact_check(args, n: int, delta: float, seed: int) -> tuple[float, float]:
    """(simulated, exact) keep % of the confirm rule for one fixed step (no choosing) `delta` from the start."""
    acc = np.array([args.a0, args.a0 + delta])
    rho = args.item_corr + (1 - args.item_corr) * args.step_corr  # latent correlation of start and step
    t0, t1 = norm.ppf(acc)
    both = multivariate_normal(mean=[0, 0], cov=[[1, rho], [rho, 1]]).cdf([t0, t1])
    p_win, p_loss = acc[1] - both, acc[0] - both
    exact = keep_probability(n - n // 2, p_win, p_loss, args.margin)
    rng = np.random.default_rng(seed)
    items = simulate(rng, args.trials, n, acc, args.item_corr, args.step_corr)
    _, confirm = halves(n)
    wins, losses, rows = paired_counts(items[0], items[1], confirm)
    return 100 * float(np.mean(confirms(wins, losses, rows, args.margin))), 100 * exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="128,256,512,1024", help="probe sizes n")
    parser.add_argument("--deltas", default="-5,-3,-1,0,3,5", help="true change of the steps, in points")
    parser.add_argument("--probes", type=int, default=5, help="probed steps per round (250 steps / 50 per probe)")
    parser.add_argument("--a0", type=float, default=0.7, help="the start's true accuracy")
    parser.add_argument("--item-corr", type=float, default=0.6, help="share of a row's latent that is its difficulty")
    parser.add_argument("--step-corr", type=float, default=0.9, help="correlation of a policy's noise between probes")
    parser.add_argument("--margin", type=float, default=0.0, help="grpo.keep_margin of the confirm rule")
    parser.add_argument("--trials", type=int, default=4000, help="simulated rounds per cell")
    parser.add_argument("--chunk", type=int, default=1000, help="rounds simulated at once (memory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="also compare with the exact keep probability")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    deltas = [float(d) / 100 for d in args.deltas.split(",")]
    t0 = time.perf_counter()

    print(
        f"a0={args.a0} probes={args.probes} item_corr={args.item_corr} step_corr={args.step_corr} "
        f"margin={args.margin} trials={args.trials}"
    )
    print("| n | delta (pts) | " + " | ".join(f"{r}: keep % | {r}: gain (pts)" for r in RULES) + " |")
    print("|---:|---:|" + "---:|---:|" * len(RULES))
    table: dict[tuple[int, float], dict[str, tuple[float, float]]] = {}
    for n in sizes:
        for i, delta in enumerate(deltas):
            table[n, delta] = cells = measure(args, n, delta, args.seed + 1000 * n + i)
            row = " | ".join(f"{cells[r][0]:.1f} | {cells[r][1]:+.2f}" for r in RULES)
            print(f"| {n} | {delta * 100:+.0f} | {row} |", flush=True)

    if args.check:
        print("\nconfirm rule, one fixed step (no choosing): simulated vs exact keep %")
        for n in sizes:
            for delta in deltas:
                simulated, exact = exact_check(args, n, delta, args.seed + 7 * n)
                print(f"n={n} delta={delta * 100:+.0f}: simulated {simulated:.1f} exact {exact:.1f}")

    print(f"\ntotal_s={time.perf_counter() - t0:.0f}")
    worse, better = min(deltas, key=lambda d: abs(d + 0.03)), min(deltas, key=lambda d: abs(d - 0.03))
    for n in sizes:
        w, b = table[n, worse], table[n, better]
        print(
            f"n={n} ci_false_keep={w['ci'][0] / 100:.3f} confirm_false_keep={w['confirm'][0] / 100:.3f} "
            f"ci_false_discard={1 - b['ci'][0] / 100:.3f} confirm_false_discard={1 - b['confirm'][0] / 100:.3f}"
        )


if __name__ == "__main__":
    main()
