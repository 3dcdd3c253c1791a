"""Does the embedded default learn? GRPO vs its SFT warmup on the held-out split, with a paired 95% CI.

Runs the default recipe end to end exactly as `make run` does (`grpo-pipeline run`, a fresh run directory, so
nothing comes from the cache), then prints:
  - held-out greedy accuracy of the SFT checkpoint and of the last GRPO round (and pass@k),
  - their difference in points with a paired bootstrap 95% CI over the same problems,
  - where the gain came from: problems with and without a carry, and the wrong greedy answers by their offset
    from the sum (addition; benchmarks/carry_errors.py does the same over all 8100 sums), or each function
    family (code),
  - the sampled-reward curve of each GRPO round (first and last logged steps) and the held-out probe,
  - for a recipe with code rewards (configs/tiny-code.yaml), the share of GRPO wall time spent in the sandbox
    (the code reward's own time, as TRL profiles it, over the round's training time),
  - wall time per stage and in total (the whole command: process start, Prefect server, every stage).
The last line is machine-readable:
  gain_pts=<x> ci_low=<y> ci_high=<z> total_s=<t>

Usage:
  python benchmarks/learning.py                       # fresh run under runs/benchmark-learning-<time>
  python benchmarks/learning.py --config configs/tiny-code.yaml   # the code RL recipe
  python benchmarks/learning.py --run-dir D --reuse   # analyse the run already in D (no training)
  python benchmarks/learning.py -- grpo.steps_per_round=300   # overrides are passed to the pipeline
  python benchmarks/learning.py --seeds 0-5 --jobs 2  # one run per seed and the mean over seeds (benchmarks/seeds.py)
  python benchmarks/learning.py --seeds 0-5 --ray HOST:PORT  # the same, each seed a Ray task (benchmarks/fanout.py)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grpo_pipeline.configs.schema import PipelineConfig, load_config  # noqa: E402
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci  # noqa: E402
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE  # noqa: E402
from grpo_pipeline.tasks.sources.synthetic import function_family, needs_carry  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from carry_errors import offset_label  # noqa: E402
from fanout import Runner, run_command  # noqa: E402
from seeds import parse_seeds, plot, report, run_seeds  # noqa: E402

Launch = Callable[[list[str], Path, dict[str, str | None]], dict]

RECORD = "benchmark-record.json"
CODE_REWARDS = ("code_tests",)  # rewards that run programs in the sandbox (rewards/code.py)
PROFILE = "profiling/Time taken: GRPOTrainer.{}"  # TRL times each reward call under this MLflow metric


def run_pipeline(
    config: Path,
    run_dir: Path,
    overrides: list[str],
    extra_env: dict[str, str] | None = None,
    launch: Launch = run_command,
) -> dict:
    """`grpo-pipeline run` in a subprocess (as `make run`), timed from the outside; `launch` starts it here or on
    a Ray cluster (benchmarks/fanout.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    summary_path = run_dir / "summary.json"
    env: dict[str, str | None] = {**(extra_env or {}), "PREFECT_HOME": str(run_dir.resolve() / ".prefect")}
    env["MLFLOW_TRACKING_URI"] = None  # the run directory's own store, so the benchmark can read it back
    env["GRPO_PIPELINE_STACK_DIR"] = str(run_dir.resolve() / "no-stack")  # never a running stack's MLflow
    cmd = [
        sys.executable,
        "-m",
        "grpo_pipeline.cli",
        "run",
        "--config",
        str(config),
        f"run_dir={run_dir}",
        *overrides,
        "--summary-json",
        str(summary_path),
    ]
    print("$", " ".join(cmd), flush=True)
    ran = launch(cmd, REPO, env)
    record = {
        "command": cmd,
        "total_s": ran["seconds"],
        "node": ran["node"],
        "summary": json.loads(summary_path.read_text()),
        "overrides": overrides,
        "config": str(config),
    }
    (run_dir / RECORD).write_text(json.dumps(record, indent=2))
    return record


def details(run_dir: Path, label: str) -> dict:
    """The per-problem scores of the one evaluation called `label` in a run directory, as columns."""
    found = sorted((run_dir / f"eval-{label}").glob(f"*/{ITEMS_FILE}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no evaluation '{label}' under {run_dir}; run the benchmark without --reuse")
    items = [json.loads(line) for line in found[-1].read_text().splitlines()]
    return {
        "prompts": [it["prompt"] for it in items],
        "answers": [str(it["answer"]) for it in items],
        "greedy_correct": [it["greedy_correct"] for it in items],
        "greedy": [str(it["greedy"]).strip() for it in items],
    }


def curves(run_dir: Path, run_id: str, correctness: str = "correctness") -> dict[str, list[tuple[int, float]]]:
    """The logged curves of one GRPO round; the sampled accuracy is the mean of the `correctness` reward."""
    import mlflow

    from grpo_pipeline.tasks.scoring.curves import PROBE_METRIC

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    keys = ["reward", f"rewards/{correctness}/mean", "frac_reward_zero_std", PROBE_METRIC]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def sandbox_share(run_dir: Path, run_id: str, rewards: list[str]) -> tuple[float, float, int] | None:
    """(seconds in the code rewards, seconds of training, reward calls) of one GRPO round, from its MLflow run:
    TRL times every reward call (`PROFILE`) and the Trainer logs `train_runtime`. None without a code reward."""
    import mlflow

    code = [r for r in rewards if r in CODE_REWARDS]
    if not code:
        return None
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    reward_s = sum(m.value for r in code for m in client.get_metric_history(run_id, PROFILE.format(r)))
    calls = len(client.get_metric_history(run_id, PROFILE.format(code[0])))  # one reward call per GRPO step
    train_s = client.get_run(run_id).data.metrics.get("train_runtime", float("nan"))
    return reward_s, train_s, calls


def seed_figures(run_dir: Path, record: dict) -> dict:
    """One seed's figures, from its run summary: the gating metric (held-out greedy accuracy) of SFT and of every
    round that produced a new policy, each round's change against the model before it and the last one's change
    against SFT (paired bootstrap 95% CIs over the same problems), how many rounds ran and why they stopped."""
    summary = record["summary"]
    rows = summary["rounds"]  # SFT, then each round that produced a new policy
    before, after = details(run_dir, "sft")["greedy_correct"], rows[-1]
    last = "sft" if after["model"] == "sft" else f"r{after['model'].rsplit(' ', 1)[-1]}"
    gain = paired_bootstrap_ci(before, details(run_dir, last)["greedy_correct"], n_boot=10_000, seed=0)
    return {
        "sft": rows[0]["value"],
        "grpo": after["value"],
        "gain": gain,
        # (round, value, (change, low, high)) of each round that produced a new policy
        "rounds": [(r["model"].rsplit(" ", 1)[-1], r["value"], (r["change"], *r["change_ci"])) for r in rows[1:]],
        "ran": len(summary.get("notes", [])),
        "stopped": summary.get("stopped", ""),
        "total_s": record["total_s"],
        "warning": summary.get("sft_warning"),
    }


def _mean_of(points: list[tuple[int, float]], first: bool, n: int = 3) -> float:
    values = [v for _, v in points]
    chunk = values[:n] if first else values[-n:]
    return sum(chunk) / len(chunk) if chunk else float("nan")


def sweep(args: argparse.Namespace, run_dir: Path) -> None:
    """`--seeds`: one run per seed, `--jobs` at a time here or each a Ray task (`--ray`); the report over seeds."""
    with Runner(args.jobs, args.ray) as runner:
        rows = run_seeds(
            parse_seeds(args.seeds),
            run_dir,
            args.overrides,
            runner,
            lambda d, overrides, env: run_pipeline(args.config, d, overrides, env, runner.launch),
            seed_figures,
        )
    if args.plot:
        plot(rows, args.plot)
    print(report(rows))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-arith.yaml")
    parser.add_argument("--run-dir", type=Path, default=None, help="Run directory (default: a fresh one under runs/).")
    parser.add_argument("--reuse", action="store_true", help="Analyse the finished run in --run-dir; do not train.")
    parser.add_argument("--seeds", help="Run once per seed (e.g. 0-5 or 0,2,4) and report over seeds.")
    parser.add_argument("--jobs", type=int, default=1, help="With --seeds: seeds run at a time (one thread each).")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="With --seeds: run each seed as a Ray task of one CPU on the cluster at ADDRESS (host:port, or 'local' "
        "for a Ray instance started here) instead of --jobs threads; run directories must be on shared storage.",
    )
    parser.add_argument("--plot", type=Path, help="With --seeds: draw accuracy per stage per seed to this PNG.")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides passed to the pipeline.")
    return parser.parse_args()


def print_scores(summary: dict, last: str, before: list[bool], after: list[bool], ci: tuple[float, ...]) -> None:
    """Each model's accuracy and pass@k, the last round against SFT, and what each round added."""
    diff, low, high = ci
    for row in summary["scores"]:
        m = row["metrics"]
        passk = ", ".join(f"{k.replace('_at_', '@')} {v:.3f}" for k, v in m.items() if k.startswith("pass"))
        print(f"  {row['model']:<14} accuracy {m['accuracy']:.3f}   {passk}")
    pairs = list(zip(after, before, strict=True))
    print(
        f"  GRPO ({last}) - SFT: {100 * diff:+.1f} points, paired bootstrap 95% CI "
        f"[{100 * low:+.1f}, {100 * high:+.1f}] (10,000 resamples); "
        f"{sum(a > b for a, b in pairs)} problems fixed, {sum(a < b for a, b in pairs)} broken"
    )
    for prev, row in zip(summary["rounds"], summary["rounds"][1:], strict=False):  # what each round added
        d, (lo, hi) = row["change"], row["change_ci"]
        print(f"  {row['model']} - {prev['model']}: {100 * d:+.1f} points, 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}]")
    if summary.get("stopped"):
        print(f"  rounds: {summary['stopped']}")


def print_breakdown(sft: dict, grpo: dict) -> None:
    """Where the gain came from: problems with and without a carry (addition), or each function family (code)."""
    before, after = sft["greedy_correct"], grpo["greedy_correct"]
    groups: dict[str, list[int]] = {}
    carry = [needs_carry(p) for p in sft["prompts"]]
    families = [function_family(a) for a in sft["answers"]]
    if None not in carry:  # the synthetic addition task
        for label, keep in (("needing a carry", True), ("without a carry", False)):
            groups[f"problems {label}"] = [i for i, c in enumerate(carry) if c == keep]
        for label, model in (("SFT", sft), ("GRPO", grpo)):
            print(f"  {label}'s wrong greedy answers: {wrong_by_offset(model)}")
    elif None not in families:  # the synthetic functions task
        for family in sorted(set(families)):
            groups[f"family {family:<9}"] = [i for i, f in enumerate(families) if f == family]
    for label, idx in groups.items():
        if idx:
            print(
                f"  {label} (n={len(idx)}): SFT {sum(before[i] for i in idx) / len(idx):.3f} -> "
                f"GRPO {sum(after[i] for i in idx) / len(idx):.3f}"
            )


def wrong_by_offset(model: dict) -> str:
    """The wrong greedy answers of an addition eval counted by how far they are from the sum: -10 is a carry into
    the tens dropped, +10 one added where none belongs; 'other' covers every other offset and non-numbers."""
    offsets = Counter(
        offset_label(greedy, int(answer))
        for answer, greedy, ok in zip(model["answers"], model["greedy"], model["greedy_correct"], strict=True)
        if not ok
    )
    return ", ".join(f"{n} off by {k}" if k != "other" else f"{n} other" for k, n in offsets.most_common()) or "none"


def print_training(run_dir: Path, cfg: PipelineConfig, summary: dict, n: int) -> None:
    """Per registered round: the sandbox's share of its time (code rewards), its sampled-reward and probe curves."""
    reward_names = [r.name for r in cfg.grpo.rewards]
    for reg in summary["registrations"]:
        c = curves(run_dir, reg["run_id"], cfg.eval.correctness_reward.name)
        share = sandbox_share(run_dir, reg["run_id"], reward_names)
        if share is not None:
            reward_s, train_s, steps = share
            per_step = f", {1000 * reward_s / steps:.0f} of {1000 * train_s / steps:.0f} ms per step" if steps else ""
            print(
                f"  sandbox share of GRPO wall time (model version {reg['version']}): {100 * reward_s / train_s:.1f}% "
                f"(code reward {reward_s:.1f} s of {train_s:.1f} s training{per_step})"
            )
        r, acc, zero = c["reward"], c[f"rewards/{cfg.eval.correctness_reward.name}/mean"], c["frac_reward_zero_std"]
        probe = c["probe/greedy_accuracy"]
        print(
            f"  sampled reward (model version {reg['version']}): {_mean_of(r, True):.3f} -> {_mean_of(r, False):.3f} "
            f"(mean of first/last 3 logs, steps {r[0][0] if r else '-'}..{r[-1][0] if r else '-'}); "
            f"sampled accuracy {_mean_of(acc, True):.3f} -> {_mean_of(acc, False):.3f}; "
            f"groups with zero reward std {_mean_of(zero, True):.2f} -> {_mean_of(zero, False):.2f}"
        )
        if probe:
            print(
                f"  held-out probe ({min(cfg.grpo.probe_problems, n)} problems, greedy, by step): "
                + " ".join(f"{s}:{v:.2f}" for s, v in probe)
            )


def main() -> None:
    args = parse_args()
    run_dir = args.run_dir or REPO / "runs" / f"benchmark-learning-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.seeds:
        sweep(args, run_dir)
        return
    if args.reuse:
        if not (run_dir / RECORD).exists():
            raise SystemExit(f"--reuse: {run_dir / RECORD} does not exist; run the benchmark first")
        record = json.loads((run_dir / RECORD).read_text())
    else:
        record = run_pipeline(args.config, run_dir, args.overrides)
    cfg = load_config(record["config"], [f"run_dir={run_dir}", *record["overrides"]])
    summary = record["summary"]
    labels = ["sft", *(f"r{row['model'].rsplit(' ', 1)[-1]}" for row in summary["rounds"][1:])]
    last = labels[-1]  # the last round that produced a new policy (grpo.rounds is a maximum)

    sft, grpo = details(run_dir, "sft"), details(run_dir, last)
    if sft["prompts"] != grpo["prompts"]:
        raise SystemExit("the SFT and GRPO evaluations are not on the same problems; cannot pair them")
    before, after = sft["greedy_correct"], grpo["greedy_correct"]
    diff, low, high = paired_bootstrap_ci(before, after, n_boot=10_000, seed=0)
    n = len(before)

    print()
    print(
        f"recipe {cfg.name} ({args.config.name}), held-out problems n={n}, greedy decoding, "
        f"pass@k with n={cfg.eval.n_samples} samples at T={cfg.eval.temperature}"
    )
    print_scores(summary, last, before, after, (diff, low, high))
    print_breakdown(sft, grpo)
    print_training(run_dir, cfg, summary, n)
    print("  wall time per stage:")
    for s in summary["stages"]:
        print(f"    {s['stage']:<16} {s['seconds']:7.1f} s{'  (cached)' if s['cached'] else ''}")
    stages_s = sum(s["seconds"] for s in summary["stages"])
    print(f"    {'stages total':<16} {stages_s:7.1f} s; whole command {record['total_s']:.1f} s")
    print(f"gain_pts={100 * diff:.1f} ci_low={100 * low:.1f} ci_high={100 * high:.1f} total_s={record['total_s']:.0f}")


if __name__ == "__main__":
    main()
