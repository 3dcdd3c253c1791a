"""What does orchestration cost? One recipe three ways, in one run, each a fresh process on a fresh run directory:

  (a) the flow's body (flows/grpo_pipeline.py `run_stages`) with each stage's plain function called directly: no
      Prefect task, state, result store or server;
  (b) `grpo-pipeline run` with a temporary Prefect server (no stack running);
  (c) `grpo-pipeline run` against the running stack (`grpo-pipeline serve`, started here on free ports);

then a fully cached rerun of (b) and of (c). Every time is the whole command, from process start to exit. The
last line is machine-readable:
  overhead_pct=<(c)/(a)-1> ephemeral_overhead_pct=<(b)/(a)-1> warm_pct=<cached (c) / cold (c)>   (percent)

Usage:
  python benchmarks/overhead.py                          # a shortened default recipe (about 2 minutes a run)
  python benchmarks/overhead.py -- sft.max_steps=3500    # overrides for the recipe (here: the full SFT)
The smoke run of `make test-benchmarks` passes micro overrides (tests/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = "configs/tiny-arith.yaml"
# The default recipe, shortened so that three cold runs fit in a few minutes; the overhead is a fixed cost, so a
# longer recipe only lowers its share.
SHORT = ["sft.max_steps=1500", "grpo.rounds=1", "grpo.steps_per_round=150", "data.num_eval=300"]

# (a): the flow's own body (flows/grpo_pipeline.py `run_stages`: the same stages in the same order with the same
# inputs) with every stage called as its plain function, so the loop cannot drift from the flow it is measured against
PLAIN_LOOP = textwrap.dedent("""
    import json, sys, time
    from grpo_pipeline.configs.schema import load_config
    from grpo_pipeline.flows.grpo_pipeline import run_stages
    from grpo_pipeline.flows.stages import Stages
    from grpo_pipeline.flows.summary import StageRecord

    class PlainStages(Stages):
        def __call__(self, name, stage, /, *, listed=True, **inputs):
            start = time.perf_counter()
            out = stage.fn(**inputs)  # the stage function itself: no task run, state, result store or server
            if listed:
                seconds = time.perf_counter() - start
                self.records.append(StageRecord(stage=name, seconds=seconds, cached=False, state="Completed"))
            return out

        def at_once(self, calls):
            return [self(name, stage, **inputs) for name, stage, inputs in calls]

    run = PlainStages()
    run_stages(load_config(sys.argv[2], sys.argv[3:]), run)
    with open(sys.argv[1], "w") as f:
        json.dump({"stages": [{"stage": r.stage, "seconds": r.seconds} for r in run.records]}, f)
""")


def timed(cmd: list[str], env: dict[str, str], label: str) -> float:
    words = [Path(c).name if c.startswith("/") else c for c in cmd[:4]]
    shown = "python -c <stage loop>" if "-c" in cmd else " ".join(words)
    print(f"[{label}] $ {shown} ...", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"[{label}] failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(f"[{label}] {seconds:.1f} s", flush=True)
    return seconds


def print_stage_table(files: dict[str, Path], times: dict[str, float]) -> None:
    """Where the difference goes: each stage's wall time in the three cold runs, and the time outside the stages
    (imports, the temporary server's start-up, the flow's bookkeeping, exit). Stage times vary from run to run by
    more than the orchestration costs (the same SFT has taken 123 to 153 s here), so the time outside the stages is
    the steadier measure of what Prefect adds."""
    seconds = {way: {s["stage"]: s["seconds"] for s in json.loads(f.read_text())["stages"]} for way, f in files.items()}
    print(f"\n{'stage (cold runs)':40} {'(a)':>8} {'(b)':>8} {'(c)':>8}")
    for name in seconds["a"]:
        print(f"{name:40} " + " ".join(f"{seconds[way].get(name, float('nan')):8.1f}" for way in "abc"))
    stages = {way: sum(seconds[way].values()) for way in "abc"}
    outside = {way: times[way] - stages[way] for way in "abc"}
    print(f"{'sum of stages':40} " + " ".join(f"{stages[way]:8.1f}" for way in "abc"))
    print(f"{'outside the stages':40} " + " ".join(f"{outside[way]:8.1f}" for way in "abc"))
    extra = {way: 100 * (outside[way] - outside["a"]) / times["a"] for way in "bc"}
    print(f"time outside the stages beyond (a)'s, as a share of (a): (b) {extra['b']:.1f}%, (c) {extra['c']:.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides for the recipe")
    args = parser.parse_args()
    overrides = [*SHORT, *args.overrides]
    work = Path(tempfile.mkdtemp(prefix="grpo-overhead-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    # no stack for (a) and (b): point the stack lookup at an empty directory
    alone = {**base, "GRPO_PIPELINE_STACK_DIR": str(work / "no-stack"), "PREFECT_HOME": str(work / "prefect-b")}
    cli = [str(BIN / "grpo-pipeline"), "run", "--config", CONFIG]

    times: dict[str, float] = {}
    stages = {way: work / f"stages-{way}.json" for way in "abc"}
    plain = [sys.executable, "-c", PLAIN_LOOP, str(stages["a"]), CONFIG]
    times["a"] = timed([*plain, f"run_dir={work / 'a'}", *overrides], alone, "a")
    times["b"] = timed([*cli, f"--summary-json={stages['b']}", f"run_dir={work / 'b'}", *overrides], alone, "b cold")
    times["b_warm"] = timed([*cli, f"run_dir={work / 'b'}", *overrides], alone, "b cached")

    stack_env = {**base, "GRPO_PIPELINE_STACK_DIR": str(work / "stack"), "PREFECT_HOME": str(work / "prefect-c")}
    serve = [str(BIN / "grpo-pipeline"), "serve", "--prefect-port", "0", "--mlflow-port", "0"]
    started = subprocess.run(serve, cwd=REPO, env=stack_env, capture_output=True, text=True)
    if started.returncode != 0:
        sys.exit(f"[c] grpo-pipeline serve failed:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}")
    try:
        cold_c = [*cli, f"--summary-json={stages['c']}", f"run_dir={work / 'c'}", *overrides]
        times["c"] = timed(cold_c, stack_env, "c cold")
        times["c_warm"] = timed([*cli, f"run_dir={work / 'c'}", *overrides], stack_env, "c cached")
    finally:
        subprocess.run([str(BIN / "grpo-pipeline"), "stop"], cwd=REPO, env=stack_env, check=False)

    print(f"\n{'way':40} {'seconds':>8} {'vs (a)':>8}")
    for key, label in [("a", "(a) stage functions, no Prefect"), ("b", "(b) CLI, temporary Prefect server"),
                       ("c", "(c) CLI, running stack"), ("b_warm", "(b) cached rerun"),
                       ("c_warm", "(c) cached rerun")]:  # fmt: skip
        print(f"{label:40} {times[key]:8.1f} {times[key] / times['a']:7.2f}x")
    print_stage_table(stages, times)
    print(f"run directories under {work}")
    print(
        f"overhead_pct={100 * (times['c'] / times['a'] - 1):.1f} "
        f"ephemeral_overhead_pct={100 * (times['b'] / times['a'] - 1):.1f} "
        f"warm_pct={100 * times['c_warm'] / times['c']:.1f}"
    )


if __name__ == "__main__":
    main()
