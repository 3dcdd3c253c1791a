r"""Which GRPO objective learns best here? Round 1 of an embedded recipe with each of TRL's loss types and with GSPO,
from one SFT checkpoint per seed, over several seeds (docs/algorithms.md).

For each seed S (`seed=S data.seed=S`, one run directory per seed and recipe) the recipe runs once per variant with
`grpo.rounds=1` and the variant's settings through `grpo-pipeline run`, exactly as a user would: data, base model
and SFT are the same stages with the same keys, so the first variant trains SFT and the others take it from the
cache; each variant's round is then trained, evaluated on the held-out split and registered (under a model name of
its own). Printed, per recipe and variant: greedy held-out accuracy, its mean over seeds with a 95% t-interval, the
paired difference from `dapo` (the default) with a t-interval over seeds, and seconds per GRPO step (the trainer's
`train_runtime` over its steps, so probes and evaluation are left out). `--jobs 2` runs two seeds at a time with one
thread each: seconds per step are then those of a loaded machine, the same for every variant; `--ray ADDRESS`
runs each variant's command as a Ray task of one CPU instead (one thread too, so the same results).

Usage:
  python benchmarks/algorithms.py --seeds 0-2 --jobs 2                      # tiny-arith and tiny-code
  python benchmarks/algorithms.py --recipes configs/tiny-arith.yaml --seeds 0-2 --variants dapo,cispo
  # off-policy, every round keeping its best-probed step (the default recipe may otherwise return its start):
  python benchmarks/algorithms.py --regimes num_iterations=2,num_iterations=4,steps_per_generation=4 \
      -- grpo.keep_over_start=false grpo.keep_margin=0
  python benchmarks/algorithms.py --run-dir D ...   # finished variants in D are reused, not trained again
  python benchmarks/algorithms.py --seeds 0-5 --ray HOST:PORT   # each variant a Ray task (benchmarks/fanout.py)
The last line is machine-readable: best=<recipe@regime:variant,...> beats_dapo=<recipe@regime:variant,...>
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from scipy import stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from fanout import ONE_THREAD, Runner  # noqa: E402
from learning import Launch, run_pipeline  # noqa: E402
from seeds import parse_seeds  # noqa: E402

# The objective of each variant (docs/algorithms.md); everything else is the recipe's own.
VARIANTS: dict[str, list[str]] = {
    "dapo": ["grpo.loss_type=dapo"],
    "grpo": ["grpo.loss_type=grpo"],
    "dr_grpo": ["grpo.loss_type=dr_grpo"],
    "bnpo": ["grpo.loss_type=bnpo"],
    "cispo": ["grpo.loss_type=cispo", "grpo.epsilon_high=5.0"],  # ScaleRL's cap
    "sapo": ["grpo.loss_type=sapo"],
    "luspo": ["grpo.loss_type=luspo", "grpo.importance_sampling_level=sequence"],
    "vespo": ["grpo.loss_type=vespo", "grpo.vllm_importance_sampling_mode=token_truncate"],
    # GSPO (Zheng et al. 2025): sequence-level ratios with the grpo loss and the paper's clipping range
    "gspo": [
        "grpo.loss_type=grpo",
        "grpo.importance_sampling_level=sequence",
        "grpo.epsilon=3e-4",
        "grpo.epsilon_high=4e-4",
    ],
}
RECIPES = ("configs/tiny-arith.yaml", "configs/tiny-code.yaml")
# How far from on-policy each optimizer step is. On-policy (one step per generation, no vLLM) the importance ratio is
# exactly 1 and four of the loss types are one update (docs/algorithms.md); off-policy they are not: each batch of
# completions is used for num_iterations optimizer steps, or split into steps_per_generation steps.
REGIMES: dict[str, list[str]] = {
    "on-policy": [],
    "num_iterations=2": ["grpo.num_iterations=2"],
    "num_iterations=4": ["grpo.num_iterations=4"],
    "steps_per_generation=4": ["grpo.steps_per_generation=4"],
}


def run_variant(
    config: Path, seed_dir: Path, seed: int, variant: str, extra: list[str], env: dict[str, str], launch: Launch
) -> dict:
    """One variant's round 1 on one seed (reused when its record exists): accuracy and seconds per step; `launch`
    starts the run here or on a Ray cluster (benchmarks/fanout.py). `variant` is a VARIANTS name, or one followed by
    @regime (a REGIMES name) for the same objective off-policy."""
    objective, _, regime = variant.partition("@")
    record_file = seed_dir / f"variant-{variant}.json"
    if record_file.exists():
        return json.loads(record_file.read_text())
    overrides = [f"seed={seed}", f"data.seed={seed}", "grpo.rounds=1", *VARIANTS[objective], *extra]
    overrides += REGIMES[regime or "on-policy"]
    overrides.append(f"registry.model_name={config.stem}-{objective}" + (f"-{regime.replace('=', '')}" * bool(regime)))
    record = run_pipeline(config, seed_dir, overrides, env, launch)
    summary = record["summary"]
    if not summary["registrations"]:  # keep_over_start returned the start: the round has no policy of its own
        raise SystemExit(
            f"{config.stem} seed {seed} {variant}: round 1 returned its start ({summary.get('stopped')}), so it has no "
            "accuracy of its own to compare; pass grpo.keep_over_start=false grpo.keep_margin=0 to keep its best step"
        )
    [registration] = summary["registrations"]
    accuracy = {row["model"]: row["metrics"]["accuracy"] for row in summary["scores"]}
    steps, runtime = train_time(seed_dir, registration["run_id"])
    result = {
        "recipe": config.stem,
        "seed": seed,
        "variant": objective,
        "regime": regime or "on-policy",
        "sft": accuracy.get("sft", float("nan")),
        "accuracy": accuracy["grpo round 1"],
        "steps": steps,
        "s_per_step": runtime / steps if steps else float("nan"),
        "total_s": record["total_s"],
    }
    record_file.write_text(json.dumps(result, indent=2))
    return result


def train_time(run_dir: Path, run_id: str) -> tuple[int, float]:
    """(optimizer steps, training seconds) of a round, from its MLflow run."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    metrics = client.get_run(run_id).data.metrics
    runtime = metrics.get("train_runtime", float("nan"))
    return round(runtime * metrics.get("train_steps_per_second", float("nan"))), runtime


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds (in points when `values` are fractions)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def table(results: list[dict], variants: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The side-by-side table, one block per recipe and regime; the best variant of each block; the variants whose
    interval against dapo (in the same block) is above 0."""
    lines = [
        "| recipe | regime | variant | held-out greedy accuracy per seed | mean (95% CI over seeds) "
        "| - dapo, points (95% CI) | s/step |",
        "|---|---|---|---|---|---|---:|",
    ]
    best, beats = [], []
    for recipe, regime in dict.fromkeys((r["recipe"], r.get("regime", "on-policy")) for r in results):
        block = [r for r in results if r["recipe"] == recipe and r.get("regime", "on-policy") == regime]
        rows = {v: sorted((r for r in block if r["variant"] == v), key=lambda r: r["seed"]) for v in variants}
        base = {r["seed"]: r["accuracy"] for r in rows.get("dapo", [])}
        means = {}
        for variant, runs in rows.items():
            if not runs:
                continue
            acc = [100 * r["accuracy"] for r in runs]
            mean, lo, hi = interval(acc)
            lo, hi = max(lo, 0.0), min(hi, 100.0)  # an accuracy's interval within what an accuracy can be
            means[variant] = mean
            diffs = [100 * (r["accuracy"] - base[r["seed"]]) for r in runs if r["seed"] in base]
            vs = "-" if variant == "dapo" or not diffs else "{:+.1f} ({:+.1f}..{:+.1f})".format(*interval(diffs))
            if variant != "dapo" and len(diffs) > 1 and interval(diffs)[1] > 0:
                beats.append(f"{recipe}@{regime}:{variant}")
            per_seed = " ".join(f"{a:.1f}" for a in acc)
            step_s = statistics.fmean(r["s_per_step"] for r in runs)
            lines.append(
                f"| {recipe} | {regime} | {variant} | {per_seed} | {mean:.1f} ({lo:.1f}..{hi:.1f}) | {vs} "
                f"| {step_s:.2f} |"
            )
        sft = [100 * r["sft"] for r in rows.get("dapo", [])]
        if sft:
            lines.append(
                f"| {recipe} | {regime} | (SFT start) | {' '.join(f'{a:.1f}' for a in sft)} "
                f"| {interval(sft)[0]:.1f} | | |"
            )
        best.append(f"{recipe}@{regime}:{max(means, key=means.get)}")
    return lines, best, beats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default=",".join(RECIPES), help="Comma-separated recipe files.")
    parser.add_argument("--seeds", default="0-2", help="Seeds, e.g. 0-2 or 0,3,5 (at least 3 for an interval).")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"Any of {', '.join(VARIANTS)}.")
    parser.add_argument(
        "--regimes", default="on-policy", help=f"Comma-separated, any of {', '.join(REGIMES)} (each variant in each)."
    )
    parser.add_argument("--jobs", type=int, default=1, help="Seeds run at a time (one thread each).")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="Run each variant as a Ray task of one CPU on the cluster at ADDRESS (host:port, or 'local' for a Ray "
        "instance started here) instead of --jobs threads; run directories must be on shared storage.",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="Default: a fresh one under runs/.")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides for every variant.")
    args = parser.parse_args()
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if "dapo" not in variants:
        variants.insert(0, "dapo")  # the baseline every other variant is compared with
    regimes = args.regimes.split(",")
    if unknown := set(regimes) - set(REGIMES):
        raise SystemExit(f"unknown regimes {sorted(unknown)}; choose from {', '.join(REGIMES)}")
    runs = [v if regime == "on-policy" else f"{v}@{regime}" for regime in regimes for v in variants]
    run_dir = args.run_dir or REPO / "runs" / f"benchmark-algorithms-{time.strftime('%Y%m%d-%H%M%S')}"
    jobs = [(REPO / recipe, seed) for recipe in args.recipes.split(",") for seed in parse_seeds(args.seeds)]

    with Runner(args.jobs, args.ray) as runner:
        env = ONE_THREAD if runner.parallel else {}

        def one_seed(job: tuple[Path, int]) -> list[dict]:
            # a seed's variants in turn: the first trains SFT, the others take it from the cache
            config, seed = job
            seed_dir = run_dir / config.stem / f"seed-{seed}"
            return [run_variant(config, seed_dir, seed, v, args.overrides, env, runner.launch) for v in runs]

        results = [r for rows in runner.map(one_seed, jobs) for r in rows]
    (run_dir / "algorithms.json").write_text(json.dumps(results, indent=2))
    lines, best, beats = table(results, variants)
    print("\n".join(lines))
    print(f"best={','.join(best)} beats_dapo={','.join(beats) or 'none'}")


if __name__ == "__main__":
    main()
