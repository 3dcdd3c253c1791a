"""`benchmarks/learning.py --seeds 0-5`: the default recipe once per seed, one line each, and the mean over seeds.

Each seed S is a fresh `grpo-pipeline run` with `seed=S data.seed=S` (the model's initialisation, the data and its
split all change), in `<run dir>/seed-S`. Per seed: SFT greedy accuracy, the last round's gain over SFT and the last
round's change over the round before it, each with a paired bootstrap 95% CI over the same held-out problems, and
the whole command's wall time. Over seeds: the mean gain with a t-interval (95%) across seeds, and the worst lower
bounds. `--jobs 2` runs two seeds at a time with one thread each (the 2-core machine); wall times are then those
of a loaded machine, so `make run`'s own time is measured by a plain run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scipy import stats


def parse_seeds(text: str) -> list[int]:
    """`0-5` -> [0..5]; `0,2,4` -> [0, 2, 4]."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += range(int(lo), int(hi or lo) + 1)
    return seeds


def run_seeds(
    seeds: list[int],
    run_dir: Path,
    overrides: list[str],
    jobs: int,
    run_one: Callable[[Path, list[str], dict[str, str]], dict],
    analyse: Callable[[Path, dict], dict],
) -> list[dict]:
    """Run (or reuse, where `seed-S` holds a finished record) each seed; return each seed's analysis."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if jobs > 1 else {}

    def one(seed: int) -> dict:
        seed_dir = run_dir / f"seed-{seed}"
        record_file = seed_dir / "benchmark-record.json"
        if record_file.exists():
            record = json.loads(record_file.read_text())
        else:
            record = run_one(seed_dir, [f"seed={seed}", f"data.seed={seed}", *overrides], env)
        return {"seed": seed, **analyse(seed_dir, record)}

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, seeds))


def report(rows: list[dict]) -> str:
    """The per-seed table and the line over seeds (the last line machine-readable)."""
    lines = [
        "| seed | SFT greedy | GRPO greedy | GRPO - SFT (95% CI) | last round - round before (95% CI) | wall s |",
        "|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        rounds = "-" if r["round_change"] is None else _pts(*r["round_change"])
        lines.append(
            f"| {r['seed']} | {100 * r['sft']:.1f}% | {100 * r['grpo']:.1f}% | {_pts(*r['gain'])} | {rounds} | "
            f"{r['total_s']:.0f} |"
        )
    gains = [100 * r["gain"][0] for r in rows]
    mean = statistics.fmean(gains)
    half = stats.t.ppf(0.975, len(gains) - 1) * statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else 0
    worst_low = min(100 * r["gain"][1] for r in rows)
    changes = [r["round_change"] for r in rows if r["round_change"] is not None]
    worst_round = min((100 * c[1] for c in changes), default=float("nan"))
    lines += [
        "",
        f"over {len(rows)} seeds: mean gain {mean:+.1f} points (95% t-interval over seeds {mean - half:+.1f}.."
        f"{mean + half:+.1f}); every seed +10 or more with CI above 0: "
        f"{all(100 * r['gain'][0] >= 10 and r['gain'][1] > 0 for r in rows)}",
        f"seeds={len(rows)} mean_gain_pts={mean:.1f} min_gain_pts={min(gains):.1f} min_ci_low={worst_low:.1f} "
        f"min_round_ci_low={worst_round:.1f} max_total_s={max(r['total_s'] for r in rows):.0f}",
    ]
    return "\n".join(lines)


def _pts(d: float, lo: float, hi: float) -> str:
    return f"{100 * d:+.1f} ({100 * lo:+.1f}..{100 * hi:+.1f})"
