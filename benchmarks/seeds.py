"""`benchmarks/learning.py --seeds 0-5`: the default recipe once per seed, one line each, and the mean over seeds.

Each seed S is a fresh `grpo-pipeline run` with `seed=S data.seed=S` (the model's initialisation, the data and its
split all change), in `<run dir>/seed-S`. Per seed: SFT greedy accuracy, each round that produced a new policy with
its change against the model before it, the last one's gain over SFT (paired bootstrap 95% CIs over the same
held-out problems), how many rounds ran (grpo.rounds is a maximum) and the whole command's wall time. Over seeds:
the range of final accuracies, the mean gain with a t-interval (95%) across seeds, and the worst lower bounds
(`--plot` draws each seed's accuracy per stage). `--jobs 2` runs two seeds at a time with one thread each (the
2-core machine); wall times are then those of a loaded machine, so `make run`'s own time is measured by a plain run.
`--ray ADDRESS` (or `--ray local`) runs each seed as a Ray task of one CPU instead (benchmarks/fanout.py), each
with one thread too, so the results are the same as with `--jobs`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from fanout import ONE_THREAD, Runner
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
    runner: Runner,
    run_one: Callable[[Path, list[str], dict[str, str]], dict],
    analyse: Callable[[Path, dict], dict],
) -> list[dict]:
    """Run (or reuse, where `seed-S` holds a finished record) each seed, at once as `runner` allows (`run_one`
    starts its command through the same runner); return each seed's analysis."""
    env = ONE_THREAD if runner.parallel else {}

    def one(seed: int) -> dict:
        seed_dir = run_dir / f"seed-{seed}"
        record_file = seed_dir / "benchmark-record.json"
        if record_file.exists():
            record = json.loads(record_file.read_text())
        else:
            record = run_one(seed_dir, [f"seed={seed}", f"data.seed={seed}", *overrides], env)
        return {"seed": seed, **analyse(seed_dir, record)}

    return runner.map(one, seeds)


def report(rows: list[dict]) -> str:
    """The per-seed table (SFT, each round that produced a new policy with its change against the model before it,
    the last one's gain over SFT) and the lines over seeds (the last one machine-readable)."""
    lines = [
        "| seed | SFT greedy | rounds: greedy, change against the model before (95% CI) | GRPO - SFT (95% CI) | "
        "rounds ran | wall s |",
        "|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        rounds = "; ".join(f"r{i} {100 * v:.1f}% {_pts(*c)}" for i, v, c in r["rounds"]) or "-"
        lines.append(
            f"| {r['seed']} | {100 * r['sft']:.1f}% | {rounds} | {_pts(*r['gain'])} | {r['ran']} | {r['total_s']:.0f} |"
        )
    gains, finals = [100 * r["gain"][0] for r in rows], [100 * r["grpo"] for r in rows]
    mean = statistics.fmean(gains)
    half = stats.t.ppf(0.975, len(gains) - 1) * statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else 0
    worst_low = min(100 * r["gain"][1] for r in rows)
    worst_round = min((100 * c[1] for r in rows for _, _, c in r["rounds"]), default=float("nan"))
    lines += [
        "",
        *(f"- seed {r['seed']}: {r['stopped']}" for r in rows if r["stopped"]),
        f"over {len(rows)} seeds: final greedy accuracy {min(finals):.1f}%..{max(finals):.1f}% (mean "
        f"{statistics.fmean(finals):.1f}%); mean gain over SFT {mean:+.1f} points (95% t-interval over seeds "
        f"{mean - half:+.1f}..{mean + half:+.1f}); every SFT <= 50%: {all(r['sft'] <= 0.5 for r in rows)}; every "
        f"seed >= 95%: {min(finals) >= 95}; every round's change CI above 0: {worst_round > 0}",
        f"seeds={len(rows)} min_final={min(finals):.1f} max_sft={100 * max(r['sft'] for r in rows):.1f} "
        f"mean_gain_pts={mean:.1f} min_gain_pts={min(gains):.1f} min_ci_low={worst_low:.1f} "
        f"min_round_ci_low={worst_round:.1f} max_total_s={max(r['total_s'] for r in rows):.0f}",
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, metric: str = "held-out greedy accuracy") -> None:
    """Accuracy per stage per seed (SFT, then each round that produced a new policy) as a PNG at `path`."""
    from grpo_pipeline.tasks.scoring.curves import rounds_figure

    series = {f"seed {r['seed']}": [("SFT", r["sft"]), *((f"round {i}", v) for i, v, _ in r["rounds"])] for r in rows}
    fig = rounds_figure(series, metric, title=f"What SFT and each GRPO round reach, {len(rows)} seeds")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def _pts(d: float, lo: float, hi: float) -> str:
    return f"{100 * d:+.1f} ({100 * lo:+.1f}..{100 * hi:+.1f})"
