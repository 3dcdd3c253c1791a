"""Evaluation suites fanned out over a Ray cluster against the one-machine path, side by side in one run.

Runs the same recipe twice in fresh run directories: once as `make run` does (the suites of each model evaluated
one after the other on this machine), once with `distributed.backend=ray distributed.ray_address=ADDRESS`, where
every suite's evaluation of a model is a Ray task of one CPU, all sent at once (tasks/core/ray_tasks.py). Training
takes a few seconds (micro overrides) so that the evaluations are most of the run; it runs on the cluster too in
the second run (a Ray Train job of one worker). Prints, per model, the wall time of all its suites on each path and
their ratio, the node each suite ran on, and whether every score is the same on both paths (same seed, same code,
one thread each: it must be).

Usage (as root, with the two-node cluster of benchmarks/ray_two_nodes.sh):
  benchmarks/ray_two_nodes.sh sh -c '.venv/bin/python benchmarks/eval_fanout.py --ray "$RAY_ADDRESS"'
  .venv/bin/python benchmarks/eval_fanout.py --ray local     # a local Ray instance started by the run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from fanout import ONE_THREAD  # noqa: E402
from learning import run_pipeline  # noqa: E402

# Training of a few seconds (as tests/helpers.py's micro overrides), evaluation as the recipe has it but with more
# samples, so that the suites' wall time dominates.
OVERRIDES = [
    "data.num_train=200", "data.num_probe=8", "sft.max_steps=6", "sft.stop_at_accuracy=null", "grpo.rounds=1",
    "grpo.steps_per_round=2", "grpo.prompts_per_step=2", "grpo.generations_per_prompt=4", "grpo.keep=last",
    "grpo.keep_over_start=false", "grpo.keep_margin=0", "eval.n_samples=16",
]  # fmt: skip


def suites_of(summary: dict) -> dict[str, dict[str, float]]:
    """{model label: {evaluation stage: seconds}} from a run's summary (`evaluate-<label>[-<suite>]`)."""
    found: dict[str, dict[str, float]] = {}
    for record in summary["stages"]:
        if record["stage"].startswith("evaluate-"):
            label = record["stage"].removeprefix("evaluate-").split("-")[0]
            found.setdefault(label, {})[record["stage"]] = record["seconds"]
    return found


def placements(run_dir: Path) -> dict[str, str]:
    """{evaluation folder: node} of the evaluations that ran as Ray tasks."""
    return {
        p.parent.parent.name: json.loads(p.read_text())["node"][:8]
        for p in sorted(run_dir.glob("eval-*/*/placement.json"))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ray", required=True, help="The cluster's address (HOST:PORT), or 'local'.")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-arith.yaml")
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / f"eval-fanout-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("overrides", nargs="*", help="More key=value overrides for both runs.")
    args = parser.parse_args()
    address = [] if args.ray == "local" else [f"distributed.ray_address={args.ray}"]
    env = {**ONE_THREAD, "RAY_USAGE_STATS_ENABLED": "0"}
    here = run_pipeline(args.config, args.run_dir / "one-machine", [*OVERRIDES, *args.overrides], env)
    ray = run_pipeline(
        args.config, args.run_dir / "ray", [*OVERRIDES, "distributed.backend=ray", *address, *args.overrides], env
    )
    report(here, ray, placements(args.run_dir / "ray"))


def report(here: dict, ray: dict, nodes: dict[str, str]) -> None:
    one, fan = suites_of(here["summary"]), suites_of(ray["summary"])
    print(f"\n{'model':<6} {'suites':>6} {'one machine s':>14} {'ray s':>7} {'ratio':>6}  nodes")
    for label, stages in one.items():
        # one after the other: the sum; at once: each is timed from the common start, so the longest is the wall time
        sequential, together = sum(stages.values()), max(fan[label].values())
        where = ", ".join(nodes.get(f"eval-{s.removeprefix('evaluate-')}", "?") for s in stages)
        print(
            f"{label:<6} {len(stages):>6} {sequential:>14.1f} {together:>7.1f} {sequential / together:>6.2f}  {where}"
        )
    same = scores(here["summary"]) == scores(ray["summary"])
    print(f"scores identical on both paths: {same}")
    print(f"whole run: one machine {here['total_s']:.0f} s, ray {ray['total_s']:.0f} s")
    if not same:
        raise SystemExit(f"the scores differ:\n{scores(here['summary'])}\n{scores(ray['summary'])}")


def scores(summary: dict) -> dict:
    """{suite: [(model, metrics)]}: every score of every suite in a run's summary."""
    return {suite["name"]: [(s["model"], s["metrics"]) for s in suite["scores"]] for suite in summary["suites"]}


if __name__ == "__main__":
    main()
