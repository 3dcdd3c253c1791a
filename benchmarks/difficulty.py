"""Does the difficulty filter help round 2? Round 2 of the default recipe with and without it, from one round-1 policy.

1. `grpo-pipeline run` on the recipe with the filter off (a fresh run directory): data, SFT, round 1, round 2.
2. The same with `grpo.difficulty_filter.enabled=true`: data, SFT and round 1 come from the cache; the filter
   scores the training prompts with round 1's policy and round 2 trains on the kept ones.
3. For each further seed in `--seeds` (the pipeline runs are seed 0): round 2 alone, both ways, from the same
   round-1 policy, with the stage functions; the seed moves GRPO's sampling and the filter's, not SFT or round 1.

Greedy accuracy is paired over the same held-out problems. Printed per seed: round 1, round 2 without and with the
filter (each with the summary's bootstrap 95% CI), the kept fraction, the paired difference with - without and its
95% CI, and each arm's change from round 1; then the mean difference over seeds with its t-interval. The last line
is machine-readable:
  diff_pts=<mean over seeds> ci_low=<..> ci_high=<..> min_pts=<..> max_pts=<..> seeds=<k> kept=<mean kept fraction>

A run directory keeps what was measured (difficulty-record.json): rerunning with more `--seeds` trains only those.

Usage:
  python benchmarks/difficulty.py --run-dir /tmp/difficulty --seeds 0 1 2
  python benchmarks/difficulty.py --run-dir /tmp/difficulty --seeds 0 1 2 -- grpo.difficulty_filter.max_prompts=2000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning import run_pipeline  # noqa: E402

from grpo_pipeline.configs.schema import PipelineConfig, load_config  # noqa: E402
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, fingerprint_path  # noqa: E402
from grpo_pipeline.tasks.core.stage import RunContext  # noqa: E402
from grpo_pipeline.tasks.data import prepare_data  # noqa: E402
from grpo_pipeline.tasks.difficulty import DifficultyResult, filter_by_difficulty  # noqa: E402
from grpo_pipeline.tasks.evaluate import evaluate  # noqa: E402
from grpo_pipeline.tasks.grpo import GRPORound, grpo_train  # noqa: E402
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci  # noqa: E402
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult  # noqa: E402
from grpo_pipeline.tasks.scoring.rollouts import Rollouts  # noqa: E402

FILTER_ON = "grpo.difficulty_filter.enabled=true"


def latest_items(run_dir: Path, label: str) -> str:
    """The items file of the newest evaluation called `label` (the run that just finished wrote it)."""
    found = sorted((run_dir / f"eval-{label}").glob(f"*/{ITEMS_FILE}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no evaluation '{label}' under {run_dir}")
    return str(found[-1])


def greedy(items_path: str) -> list[int]:
    return [json.loads(line)["greedy_correct"] for line in Path(items_path).read_text().splitlines()]


def pipeline_seed(config: Path, run_dir: Path, overrides: list[str]) -> dict:
    """Seed 0 through the product: the recipe without, then with the filter (SFT and round 1 cached)."""
    off = run_pipeline(config, run_dir, overrides)
    off_items = latest_items(run_dir, "r2")
    on = run_pipeline(config, run_dir, [*overrides, FILTER_ON])
    if not any(s["stage"] == "grpo-round1" and s["cached"] for s in on["summary"]["stages"]):
        raise SystemExit("round 1 was not taken from the cache in the filtered run; the two arms do not share it")
    stage_s = {s["stage"]: s["seconds"] for s in on["summary"]["stages"]}
    return {
        "r1": latest_items(run_dir, "r1"),
        "off": off_items,
        "on": latest_items(run_dir, "r2"),
        "filter": on["summary"]["difficulty_filters"][0],
        "seconds": {"filter": stage_s["difficulty_filter-r2"], "grpo_r2_on": stage_s["grpo-round2"],
                    "grpo_r2_off": {s["stage"]: s["seconds"] for s in off["summary"]["stages"]}["grpo-round2"]},
    }  # fmt: skip


def round_one(cfg: PipelineConfig, run_dir: Path) -> tuple[Ref, Ref, Checkpoint]:
    """The run's data splits and round-1 policy, found by the data stage's key and the one round-1 directory."""
    data_dir = prepare_data.stage.out_dir({"cfg": cfg.data, "run_dir": str(run_dir)})
    train, held_out = (
        Ref(path=str(p), fingerprint=fingerprint_path(p))
        for p in (data_dir / "train.parquet", data_dir / "eval.parquet")
    )
    found = [p.parent for p in (run_dir / "grpo-round1").glob("*/meta.json")]
    if len(found) != 1:
        raise SystemExit(f"expected one round-1 policy under {run_dir / 'grpo-round1'}, found {len(found)}")
    policy = Checkpoint(path=str(found[0]), fingerprint=fingerprint_path(found[0]), stage="grpo-round1")
    return train, held_out, policy


def stage_seed(cfg: PipelineConfig, run_dir: Path, seed: int) -> dict:
    """Round 2 without and with the filter from the run's round-1 policy, GRPO (and filter) seeded by `seed`."""
    train, held_out, r1 = round_one(cfg, run_dir)
    ctx = RunContext.of(cfg).model_copy(update={"seed": seed})
    filter_cfg = cfg.grpo.difficulty_filter.model_copy(update={"enabled": True})

    def round_two(split: Ref, label: str) -> tuple[EvalResult, float]:
        start = time.perf_counter()
        spec = GRPORound(start=r1, train=split, cfg=cfg.grpo, model_cfg=cfg.model, round_index=2, ctx=ctx,
                         held_out=held_out, correctness_reward=cfg.eval.correctness_reward)  # fmt: skip
        policy = grpo_train(spec)
        seconds = time.perf_counter() - start
        return evaluate(policy, held_out, cfg.eval, ctx, label=label, rewards=cfg.grpo.rewards), seconds

    off, off_s = round_two(train, f"r2-s{seed}")
    start = time.perf_counter()
    kept: DifficultyResult = filter_by_difficulty(
        r1, train, filter_cfg, Rollouts.of(cfg), ctx, f"r2-s{seed}", min_kept=cfg.grpo.prompts_per_step
    )
    filter_s = time.perf_counter() - start
    on, on_s = round_two(kept.train, f"r2-filtered-s{seed}")
    return {
        "r1": latest_items(run_dir, "r1"),
        "off": off.items_path,
        "on": on.items_path,
        "filter": kept.model_dump(mode="json"),
        "seconds": {"filter": filter_s, "grpo_r2_on": on_s, "grpo_r2_off": off_s},
    }


def show(seed: int, arms: dict) -> float:
    r1, off, on = greedy(arms["r1"]), greedy(arms["off"]), greedy(arms["on"])
    n = len(r1)

    def acc(xs: list[int]) -> str:
        from grpo_pipeline.tasks.scoring.metrics import bootstrap_ci

        low, high = bootstrap_ci(xs, seed=0)
        return f"{sum(xs) / n:.3f} [{low:.3f}, {high:.3f}]"

    def change(a: list[int], b: list[int]) -> str:
        d, lo, hi = paired_bootstrap_ci(a, b, n_boot=10_000, seed=0)
        fixed, broken = sum(y > x for x, y in zip(a, b, strict=True)), sum(y < x for x, y in zip(a, b, strict=True))
        return f"{100 * d:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] ({fixed} fixed, {broken} broken)"

    f, s = arms["filter"], arms["seconds"]
    print(f"seed {seed} (n={n} held-out problems, greedy):")
    print(f"  round 1 {acc(r1)}; round 2 without the filter {acc(off)}, with it {acc(on)}")
    print(f"  filter: kept {f['kept']} of {f['scored']} prompts ({100 * f['kept_fraction']:.1f}%), "
          f"{f['too_easy']} too easy, {f['too_hard']} too hard, mean pass rate {f['mean_pass_rate']:.3f}")  # fmt: skip
    print(f"  round 2 - round 1: without {change(r1, off)}; with {change(r1, on)}")
    print(f"  with - without: {change(off, on)}")
    print(f"  seconds: filter {s['filter']:.0f}, round 2 without {s['grpo_r2_off']:.0f}, with {s['grpo_r2_on']:.0f}")
    return 100 * (sum(on) - sum(off)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-arith.yaml")
    parser.add_argument("--run-dir", type=Path, required=True, help="Run directory (fresh, or one to continue).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="Seeds; 0 is the pipeline's own run.")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides for both arms.")
    args = parser.parse_args()

    record_path = args.run_dir / "difficulty-record.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    cfg = load_config(args.config, [f"run_dir={args.run_dir}", *args.overrides])
    if cfg.grpo.rounds != 2:
        raise SystemExit(f"the comparison is about round 2; the recipe has grpo.rounds={cfg.grpo.rounds}")
    for seed in sorted(set(args.seeds) | {0}):
        if str(seed) not in record:  # seed 0 first: it trains SFT and round 1
            record[str(seed)] = (
                pipeline_seed(args.config, args.run_dir, args.overrides) if seed == 0
                else stage_seed(cfg, args.run_dir, seed)
            )  # fmt: skip
            record_path.write_text(json.dumps(record, indent=2))
    print()
    diffs = [show(seed, record[str(seed)]) for seed in sorted(set(args.seeds) | {0})]
    kept = [record[str(s)]["filter"]["kept_fraction"] for s in sorted(set(args.seeds) | {0})]
    mean, low, high = seed_interval(diffs)
    print(
        f"with - without over {len(diffs)} seeds: mean {mean:+.2f} pts, 95% t-interval over seeds "
        f"[{low:+.2f}, {high:+.2f}] (per seed: {', '.join(f'{d:+.1f}' for d in diffs)})"
    )
    print(
        f"diff_pts={mean:.2f} ci_low={low:.2f} ci_high={high:.2f} min_pts={min(diffs):.1f} max_pts={max(diffs):.1f} "
        f"seeds={len(diffs)} kept={sum(kept) / len(kept):.3f}"
    )


# Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond the table).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def seed_interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean of the per-seed differences and its 95% t-interval: the seeds (GRPO's sampling) are the replicates
    here, since every seed is scored on the same held-out problems."""
    k = len(diffs)
    mean = sum(diffs) / k
    if k < 2:
        return mean, float("nan"), float("nan")
    sd = (sum((d - mean) ** 2 for d in diffs) / (k - 1)) ** 0.5
    half = T_975.get(k - 1, 1.96) * sd / k**0.5
    return mean, mean - half, mean + half


if __name__ == "__main__":
    main()
