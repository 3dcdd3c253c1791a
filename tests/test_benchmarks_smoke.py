"""Every script in benchmarks/ runs once at its smallest settings (`make test-benchmarks`, a CI tier of its own: the
scripts take minutes together, beyond `make test`'s budget). A smoke run goes through the script's real path end to
end (the same commands, stages and sandbox a full run uses) on micro sizes, and must exit as the script says it
does and print its machine-readable last line; what it measures at that size means nothing. A script without an
entry in SMOKES fails `test_every_benchmark_has_a_smoke_run` (in `make test`), so a new benchmark comes with its smoke
run.

Where a script needs what this machine may lack (a CUDA GPU, vLLM's CPU build, Ray, root for namespaces, the
HumanEval file) its smoke says so: the GPU scripts run their CPU side only (`--plan`, the no-CUDA exit), named as such;
the others are skipped with the reason. .ci/run calls this tier after the others, when Ray and vLLM's environment are
installed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import cli_env, micro_overrides

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"  # make test-vllm builds it (tests/vllm_env.sh)
HUMANEVAL = ROOT.parent / "shared" / "data" / "HumanEval.jsonl.gz"
TIMEOUT_S = 1800  # a script that hangs fails instead of holding the tier


def micro(tmp: Path) -> list[str]:
    """tests/helpers.py's micro run (a few seconds of every stage), without its run directory: each script sets
    its own."""
    return [o for o in micro_overrides(tmp) if not o.startswith("run_dir=")]


# The filter keeps only prompts its policy sometimes solves, and a micro policy solves no two-digit sum: one-digit
# sums (all of them in the split, no other suite to decontaminate against), an SFT that learns their format, and
# 16 samples a prompt, so that samples hit some answers by chance (measured: 42.5% of the prompts kept). Given after
# the micro overrides, whose data sizes they replace.
FILTER_KEEPS = [
    "data.num_train=40", "data.num_eval=12", "data.num_probe=8", "sft.max_steps=100", "sft.batch_size=16",
    "data.synthetic.min_digits=1", "data.synthetic.max_digits=1", "data.synthetic.units_drill=0",
    "eval.suites=[{name: heldout}]", "grpo.difficulty_filter.samples_per_prompt=16",
]  # fmt: skip


def micro_checkpoint(tmp: Path) -> str:
    """A checkpoint folder (model and tokenizer) of the embedded tiny model at micro size, as a run saves one."""
    from grpo_pipeline.configs.model import TinyModelConfig
    from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

    small = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    return str(build_tiny_model(small, tmp / "checkpoint", seed=0))


def mbpp_rows(tmp: Path) -> str:
    """Two rows in MBPP's published format (mbpp.jsonl: text, code, task_id, test_setup_code, test_list,
    challenge_test_list), one with setup code."""
    import json

    rows = [
        {"text": "Add two numbers.", "code": "def add(a, b):\n    return a + b", "task_id": 1, "test_setup_code": "",
         "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "challenge_test_list": []},
        {"text": "Scale a number.", "code": "def scale(x):\n    return x * K", "task_id": 2, "test_setup_code": "K = 3",
         "test_list": ["assert scale(2) == 6"], "challenge_test_list": []},
    ]  # fmt: skip
    path = tmp / "mbpp.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def missing(module: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(module) else f"needs the {module!r} package (its tier installs it)"


def vllm_env() -> str | None:
    return None if VLLM_PYTHON.exists() else f"needs vLLM's CPU build in {VLLM_PYTHON.parent.parent} (make test-vllm)"


def root_and_ray() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare (benchmarks/ray_two_nodes.sh runs the cluster in namespaces of its own)"
    return missing("ray")()


def humaneval() -> str | None:
    return None if HUMANEVAL.exists() else f"needs {HUMANEVAL} (the shared data folder beside the checkout)"


@dataclass(frozen=True)
class Smoke:
    """How one script is smoke-run: its command (from a fresh temporary folder), the exit status and the start of
    the last line it must give, and why it cannot run here (None: it can)."""

    command: Callable[[Path], list[str]] = lambda tmp: []
    last_line: str = ""
    returncode: int = 0
    unavailable: Callable[[], str | None] = lambda: None
    # a module the scripts import rather than run, or a helper script: smoke-run by the named script's smoke
    runs_with: str | None = None
    cpu_side_only: bool = False  # a GPU script: only what it does without CUDA runs here


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(BENCHMARKS / name), *args]


SMOKES: dict[str, Smoke] = {
    "algorithms.py": Smoke(
        lambda tmp: script(
            "algorithms.py",
            "--recipes",
            "configs/tiny-arith.yaml",
            "--seeds",
            "0",
            "--variants",
            "dapo,cispo",
            "--run-dir",
            str(tmp / "runs"),
            "--",
            *micro(tmp),
        ),
        last_line="best=",
    ),
    "carry_errors.py": Smoke(
        lambda tmp: script("carry_errors.py", micro_checkpoint(tmp), "--samples", "1"), last_line="sampled"
    ),
    "difficulty.py": Smoke(
        lambda tmp: script(
            "difficulty.py",
            "--run-dir",
            str(tmp / "runs"),
            "--seeds",
            "0",
            "1",
            "--",
            *micro(tmp),
            *FILTER_KEEPS,
            "grpo.rounds=2",
        ),
        last_line="diff_pts=",
    ),
    "eval.py": Smoke(
        lambda tmp: script("eval.py", "--problems", "4", "--n", "2", "--repeat", "1"), last_line="speedup="
    ),
    # through benchmarks/ray_two_nodes.sh: the two-node cluster in its namespaces is both scripts' smoke run
    "eval_fanout.py": Smoke(
        lambda tmp: [
            "bash",
            str(BENCHMARKS / "ray_two_nodes.sh"),
            "sh",
            "-c",
            '"$0" benchmarks/eval_fanout.py --ray "$RAY_ADDRESS" --run-dir "$1" -- data.num_eval=24 '
            "eval.n_samples=4 eval.k=[1,4] model.tiny.hidden_size=32 model.tiny.num_layers=1 model.tiny.num_heads=2 "
            "model.tiny.intermediate_size=64",
            sys.executable,
            str(tmp / "runs"),
        ],
        unavailable=root_and_ray,
    ),
    "fanout.py": Smoke(runs_with="seeds.py"),  # the --jobs thread pool of the seed sweep
    "generation.py": Smoke(
        lambda tmp: [
            str(VLLM_PYTHON),
            str(BENCHMARKS / "generation.py"),
            "--problems",
            "4",
            "--n",
            "2",
            "--max-new-tokens",
            "4",
            "--batch-size",
            "8",
        ],
        last_line="greedy_speedup=",
        unavailable=vllm_env,
    ),
    "gpu_check.py": Smoke(lambda tmp: script("gpu_check.py", "--plan"), cpu_side_only=True),
    "gpu_throughput.py": Smoke(
        lambda tmp: script(
            "gpu_throughput.py",
            "--prompts-per-step",
            "1",
            "--generations",
            "2",
            "--prompt-tokens",
            "8",
            "--completion-tokens",
            "8",
            "--rollout-prompts",
            "2",
            "--steps",
            "1",
            "--warmup-steps",
            "0",
        ),
        last_line="gpu_throughput: no CUDA device here",
        cpu_side_only=True,
    ),
    "keep_rule.py": Smoke(
        lambda tmp: script("keep_rule.py", "--sizes", "32", "--deltas=-3,3", "--trials", "40", "--chunk", "20"),
        last_line="n=32 ci_false_keep=",
    ),
    "learning.py": Smoke(
        lambda tmp: script("learning.py", "--run-dir", str(tmp / "runs"), "--", *micro(tmp)), last_line="gain_pts="
    ),
    "mbpp_parity.py": Smoke(
        lambda tmp: script("mbpp_parity.py", mbpp_rows(tmp), "--workers", "1", "--timeout", "20"),
        last_line="mbpp_parity rows=2 plain=2 sandbox=2 disagree=0",
    ),
    "overhead.py": Smoke(lambda tmp: script("overhead.py", "--", *micro(tmp)), last_line="overhead_pct="),
    "ray_two_nodes.sh": Smoke(runs_with="eval_fanout.py"),
    "rewards.py": Smoke(lambda tmp: script("rewards.py", "--limit", "3"), last_line="speedup=", unavailable=humaneval),
    "seeds.py": Smoke(
        lambda tmp: script(
            "learning.py", "--seeds", "0-1", "--jobs", "2", "--run-dir", str(tmp / "runs"), "--", *micro(tmp)
        ),
    ),
    "stdio.py": Smoke(
        lambda tmp: script("stdio.py", "--programs", "10", "--cases", "2", "--timeout", "5"), last_line="stdio_speedup="
    ),
}
SCRIPTS = sorted(p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh"))


def test_every_benchmark_has_a_smoke_run() -> None:
    assert set(SCRIPTS) == set(SMOKES), f"give each benchmark a smoke entry here: {sorted(set(SCRIPTS) ^ set(SMOKES))}"
    for name, smoke in SMOKES.items():
        if smoke.runs_with:  # run by another script's smoke, which must exist and import or call it
            host = SMOKES[smoke.runs_with]
            assert not host.runs_with, f"{name}: {smoke.runs_with} has no smoke command of its own"
            command = " ".join(host.command(Path("/tmp/smoke")))
            used = f"from {Path(name).stem} import" in (BENCHMARKS / smoke.runs_with).read_text() or name in command
            assert used, f"{smoke.runs_with}'s smoke run neither imports nor runs {name}"


@pytest.mark.benchmarks
@pytest.mark.parametrize("name", [n for n in SCRIPTS if n in SMOKES and not SMOKES[n].runs_with])
def test_benchmark_smoke_run(name: str, tmp_path: Path) -> None:
    smoke = SMOKES[name]
    if reason := smoke.unavailable():
        pytest.skip(f"{name}: {reason}")
    command = smoke.command(tmp_path)
    try:
        ran = subprocess.run(
            command, cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: no end within {TIMEOUT_S} s: {' '.join(command)}")
    output = f"{ran.stdout[-6000:]}\n{ran.stderr[-6000:]}"
    assert ran.returncode == smoke.returncode, f"{name} exited {ran.returncode}:\n{output}"
    lines = ran.stdout.strip().splitlines()
    assert lines, f"{name} printed nothing:\n{output}"
    assert lines[-1].startswith(smoke.last_line), f"{name}'s last line is not '{smoke.last_line}...':\n{output}"
