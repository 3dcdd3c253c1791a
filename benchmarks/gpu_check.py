"""`make gpu-check`: everything in the pipeline that only a CUDA GPU can run, exercised once in a few minutes, with
one summary line of figures. The model is a small Qwen2 with random weights and a byte-level tokenizer built here
(benchmarks/gpu_throughput.py's builder and its SMALL_QWEN2), so nothing is downloaded; the task is the embedded
tiny-arith data. Every part goes through the pipeline's own code (its GRPO stage, its evaluation), each in a fresh
process (vLLM and torch.distributed keep state per process), timed, and a part that fails is reported by name
without stopping the others:

  vllm_grpo  GRPO steps with vLLM colocated in the training process (grpo.use_vllm=true): seconds per step, and
             the policy's meta.json must say its rollouts came from vLLM;
  eval       held-out evaluation generating through vLLM (eval.backend=vllm): completion tokens per second over
             the whole call, the engine's start included;
  bf16       GRPO steps with transformers' generate under bf16 autocast (model.dtype=bfloat16): seconds per step,
             and the trained weights and optimizer state must be float32 (master weights);
  qlora      GRPO steps training LoRA adapters on a 4-bit NF4 base (model.load_in_4bit, bitsandbytes): seconds
             per step;
  ddp        GRPO steps in two processes (distributed.num_processes=2, accelerate's data parallel, NCCL): seconds
             per step; skipped with fewer than two GPUs.

The last line is the summary, in this form:
  gpu-check: ok vllm_grpo=<s> s/step (first <s> s) eval=<n> tok/s bf16=<s> s/step (first <s> s) ...
(training parts: the median step after the first, which carries CUDA's start-up)
and the exit status is 0 only when no part failed. Without CUDA nothing is measured: it lists the parts and exits 2
with the reason. `--plan` lists the parts and what each measures, anywhere. Each part's log is kept under --work.

Usage: make gpu-check   (or: python benchmarks/gpu_check.py [--work DIR] [--steps N] [--parts vllm_grpo,eval])
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

BUDGET_S = 450  # the whole check stays under 8 minutes: a part gets what is left of this, at most its own limit


@dataclass(frozen=True)
class Part:
    name: str
    measures: str
    needs: tuple[str, ...]  # Python packages the part imports
    overrides: tuple[str, ...] = ()  # the pipeline settings of its GRPO steps, over base_overrides()
    gpus: int = 1
    limit_s: int = 150


PARTS: tuple[Part, ...] = (
    Part(
        "vllm_grpo", "GRPO steps with vLLM colocated (grpo.use_vllm=true): s/step", ("vllm",), ("grpo.use_vllm=true",)
    ),
    Part("eval", "evaluation generating through vLLM (eval.backend=vllm): tok/s, engine start included", ("vllm",)),
    Part(
        "bf16",
        "GRPO steps with HF generate under bf16 autocast, float32 master weights: s/step",
        (),
        ("grpo.use_vllm=false", "model.train_precision=mixed"),
    ),
    Part(
        "qlora",
        "GRPO steps of LoRA on a 4-bit NF4 base (bitsandbytes): s/step",
        ("bitsandbytes", "peft"),
        ("grpo.use_vllm=false", "model.lora={}", "model.load_in_4bit=true"),
    ),
    Part(
        "ddp",
        "GRPO steps in 2 processes (distributed.num_processes=2, NCCL): s/step",
        (),
        ("grpo.use_vllm=false", "distributed.num_processes=2"),
        gpus=2,
    ),
)
BY_NAME = {p.name: p for p in PARTS}


def digit_share(prompts: list, completions: list, **_: Any) -> list[float]:
    """The share of digits in each completion: a reward that a random model's completions spread over, so groups
    have a non-zero advantage and the weights move (the task's own rewards are all 0 for a random model)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


# ----------------------------------------------------------------------------- what runs where


def cuda_devices() -> int:
    """CUDA devices torch sees (0 without CUDA or without a CUDA build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def skip_reason(part: Part, gpus: int) -> str | None:
    """Why `part` cannot run on this machine (a skip, not a failure), or None."""
    if gpus < part.gpus:
        return f"{gpus} gpu"
    return None


def missing(part: Part) -> list[str]:
    """The packages `part` needs that are not installed: a failure, since `make gpu-check` installs them."""
    return [name for name in part.needs if importlib.util.find_spec(name) is None]


def plan_text() -> str:
    lines = ["gpu-check measures, each part in a process of its own, on a random-weight Qwen2 built locally:"]
    lines += [f"  {p.name:10} {p.measures}" + (f" (needs {p.gpus} GPUs)" if p.gpus > 1 else "") for p in PARTS]
    return "\n".join(lines)


def summary_line(results: dict[str, str], failed: list[str]) -> str:
    """`gpu-check: ok|FAILED(<parts>) part=figure ...` in the order of PARTS."""
    head = "ok" if not failed else f"FAILED({','.join(failed)})"
    return "gpu-check: " + " ".join([head, *(f"{name}={results[name]}" for name in results)])


# ----------------------------------------------------------------------------- the parts (each in a child process)


def base_overrides(model_dir: Path, work: Path, steps: int) -> list[str]:
    """A few GRPO steps of the pipeline's stage on the local model: tiny-arith data, no SFT, no probes."""
    return [
        f"run_dir={work / 'runs'}",
        f"model.base={model_dir}",
        "model.dtype=bfloat16",
        "sft.enabled=false",
        "data.num_train=128",
        "data.num_eval=64",
        "data.num_probe=0",
        f"grpo.steps_per_round={steps}",
        "grpo.prompts_per_step=4",
        "grpo.generations_per_prompt=4",
        "grpo.max_completion_tokens=32",
        "grpo.learning_rate=1e-4",
        "grpo.log_every_steps=1",
        "grpo.probe_problems=0",
        "grpo.save_every_steps=0",
        "grpo.rewards=[{name: 'gpu_check:digit_share'}]",
    ]


def grpo_steps(model_dir: Path, work: Path, steps: int, overrides: list[str]) -> dict[str, Any]:
    """Train `steps` GRPO steps through the pipeline's GRPO stage; return the policy's meta.json, the trainer's
    step times (TRL's `step_time` per step, from its MLflow run), the whole training's seconds per step
    (train_runtime / steps) and the stage's wall time."""
    import mlflow

    from grpo_pipeline.configs.schema import load_config
    from grpo_pipeline.tasks.core.runtime import setup
    from grpo_pipeline.tasks.core.stage import RunContext
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
    from grpo_pipeline.tasks.model import prepare_base_model

    cfg = load_config(None, [*base_overrides(model_dir, work, steps), *overrides])
    setup(cfg)
    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    start = time.perf_counter()
    policy = grpo_train(
        GRPORound(
            start=base, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=RunContext.of(cfg)
        )
    )
    wall_s = time.perf_counter() - start
    meta = json.loads((Path(policy.path) / "meta.json").read_text())
    client = mlflow.MlflowClient()
    runtime = client.get_run(policy.run_id).data.metrics["train_runtime"]
    step_times = [m.value for m in sorted(client.get_metric_history(policy.run_id, "step_time"), key=lambda m: m.step)]
    return {"meta": meta, "s_per_step": runtime / meta["steps"], "step_times": step_times, "wall_s": wall_s}


def step_figure(step_times: list[float], s_per_step: float) -> str:
    """Seconds per step once warm: the median of the steps after the first, whose CUDA context, kernel loading and
    allocator growth a few steps would otherwise average in (on an H200 the first of 8 bf16 steps took 11.5 s and
    the median of the other seven 0.23 s). Without step times, or with one, the whole training's average, said as
    such."""
    if len(step_times) < 2:
        return f"{s_per_step:.2f} s/step (average, first step included)"
    return f"{statistics.median(step_times[1:]):.2f} s/step (first {step_times[0]:.1f} s)"


# What each training part's policy must say of itself (its meta.json, tasks/training/trainer.save_policy): the
# problem, or None. A part that ran but not as asked (HF generate instead of vLLM, bf16 weights) has failed.
def vllm_rollouts(meta: dict[str, Any]) -> str | None:
    rollouts = meta.get("rollouts", "")
    return None if rollouts.startswith("vLLM colocated") else f"rollouts came from {rollouts!r}, not colocated vLLM"


def master_weights(meta: dict[str, Any]) -> str | None:
    want = {"weights": "float32", "optimizer_state": "float32", "autocast": "bf16"}
    return None if meta.get("precision") == want else f"trained with {meta.get('precision')}, not {want}"


def two_processes(meta: dict[str, Any]) -> str | None:
    return None if meta.get("processes") == 2 else f"trained in {meta.get('processes')} processes, not 2"


def some_steps(meta: dict[str, Any]) -> str | None:
    return None if meta.get("steps", 0) > 0 else f"trained {meta.get('steps')} steps"


CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "vllm_grpo": vllm_rollouts,
    "bf16": master_weights,
    "qlora": some_steps,
    "ddp": two_processes,
}


def part_training(name: str) -> Callable[[Path, Path, int], str]:
    """The runner of a training part: its GRPO steps, its check, its seconds per step."""

    def run(model_dir: Path, work: Path, steps: int) -> str:
        r = grpo_steps(model_dir, work, steps, list(BY_NAME[name].overrides))
        if (problem := CHECKS[name](r["meta"])) is not None:
            raise RuntimeError(f"{name}: {problem}")
        return step_figure(r["step_times"], r["s_per_step"])

    return run


# 64 held-out problems, greedy and 8 samples of up to 32 tokens each (a random model runs each to the limit)
EVAL_SETTINGS: dict[str, Any] = {"n_samples": 8, "k": [1, 8], "max_new_tokens": 32, "backend": "vllm"}


def part_eval(model_dir: Path, work: Path, steps: int) -> str:
    """Evaluate the random model on the held-out problems through vLLM; completion tokens per second."""
    from transformers import AutoTokenizer

    from grpo_pipeline.configs.schema import EvalConfig, load_config
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.scoring.evaluation import evaluate_model

    cfg = load_config(None, base_overrides(model_dir, work, steps))
    data = prepare_data(cfg.data, cfg.run_dir)
    eval_cfg = EvalConfig(**EVAL_SETTINGS, max_unscored_fraction=1.0)  # a random model's answers are all wrong
    start = time.perf_counter()
    result = evaluate_model(str(model_dir), data.eval, eval_cfg, seed=0, out=work / "eval", label="gpu-check")
    seconds = time.perf_counter() - start
    if result.generation["backend"] != "vllm":
        raise RuntimeError(f"eval: generated by {result.generation['backend']!r}, not vLLM")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    items = result.items()
    texts = [*items["greedy"], *(s for samples in items["samples"] for s in samples)]
    tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return f"{tokens / seconds:.0f} tok/s"


RUNNERS: dict[str, Callable[[Path, Path, int], str]] = {
    "vllm_grpo": part_training("vllm_grpo"),
    "eval": part_eval,
    "bf16": part_training("bf16"),
    "qlora": part_training("qlora"),
    "ddp": part_training("ddp"),
}


# ----------------------------------------------------------------------------- orchestration


def run_part(part: Part, model_dir: Path, work: Path, steps: int, limit_s: float) -> tuple[bool, str]:
    """Run one part in a fresh process within `limit_s`; (passed, figure or the reason it failed)."""
    part_dir, log = work / part.name, work / f"{part.name}.log"
    part_dir.mkdir(parents=True, exist_ok=True)
    result = part_dir / "result.json"
    cmd = [sys.executable, __file__, "--part", part.name, "--model-dir", str(model_dir), "--work", str(part_dir)]
    cmd += ["--steps", str(steps)]
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{part_dir / 'mlflow.db'}",
        "PREFECT_HOME": str(part_dir / ".prefect"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),  # the reward
    }
    print(f"[{part.name}] running (limit {limit_s:.0f} s, log {log}) ...", flush=True)
    start = time.perf_counter()
    try:
        with log.open("w") as out:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {limit_s:.0f} s"
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        print(f"[{part.name}] FAILED (exit {proc.returncode}) after {seconds:.0f} s:\n  " + "\n  ".join(tail))
        return False, f"exit {proc.returncode}"
    figure = json.loads(result.read_text())["figure"]
    print(f"[{part.name}] ok in {seconds:.0f} s: {figure}", flush=True)
    return True, figure


def run_all(parts: list[Part], work: Path, steps: int, gpus: int) -> tuple[dict[str, str], list[str]]:
    """Build the model, run every part in turn within the budget; (figure per part, the parts that failed)."""
    from gpu_throughput import SMALL_QWEN2, build_qwen2

    model_dir = build_qwen2(work / "model", SMALL_QWEN2, seed=0, dtype="bfloat16")
    deadline = time.perf_counter() + BUDGET_S
    results: dict[str, str] = {}
    failed: list[str] = []
    for part in parts:
        if (reason := skip_reason(part, gpus)) is not None:
            results[part.name] = f"skipped({reason})"
            continue
        if absent := missing(part):
            results[part.name] = f"failed(not installed: {','.join(absent)})"
            failed.append(part.name)
            continue
        left = deadline - time.perf_counter()
        if left < 30:
            results[part.name] = "failed(no time left in the check's budget)"
            failed.append(part.name)
            continue
        ok, figure = run_part(part, model_dir, work, steps, min(part.limit_s, left))
        results[part.name] = figure if ok else f"failed({figure})"
        if not ok:
            failed.append(part.name)
    return results, failed


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="List the parts and what each measures; run nothing.")
    parser.add_argument("--preflight", action="store_true", help="Only check for CUDA (exit 2 without it).")
    parser.add_argument("--parts", default=",".join(p.name for p in PARTS), help="Comma-separated parts to run.")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per training part.")
    parser.add_argument("--work", type=Path, default=None, help="Where models, runs and logs go (default: runs/).")
    parser.add_argument("--part", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.part:  # a child process: one part
        figure = RUNNERS[args.part](args.model_dir, args.work, args.steps)
        (args.work / "result.json").write_text(json.dumps({"figure": figure}))
        return 0
    if args.plan:
        print(plan_text())
        return 0
    gpus = cuda_devices()
    if gpus == 0:
        print(plan_text())
        print(
            "gpu-check: refused: no CUDA device here (torch.cuda.is_available() is False), so nothing was measured; "
            'run it on a machine with an NVIDIA GPU, a CUDA build of torch and the gpu extra (pip install -e ".[gpu]")'
        )
        return 2
    if args.preflight:
        print(f"gpu-check: {gpus} CUDA device(s) found")
        return 0
    unknown = set(args.parts.split(",")) - set(RUNNERS)
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; choose from {', '.join(RUNNERS)}")
    parts = [p for p in PARTS if p.name in args.parts.split(",")]
    work = args.work or REPO / "runs" / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    import torch

    print(f"gpu-check on {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}; work dir {work}")
    results, failed = run_all(parts, work.resolve(), args.steps, gpus)
    print(summary_line(results, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
