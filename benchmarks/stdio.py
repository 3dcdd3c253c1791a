"""Benchmark: stdin/stdout tests in the sandbox vs one `python` subprocess per test case.

(a) naive: what local runners in this field do: write the program to a file and run `python program.py` once per
    test case with the input on stdin (`subprocess.run(..., input=..., timeout=...)`), no isolation; the same
    number of programs in parallel as the sandbox has workers, so the ratio is per core, not a parallelism gain;
(b) the `code_tests` reward's sandbox (rewards/sandbox/) with isolation on: one fork per case from a launcher
    whose Python is already started.
Programs: `--programs` generated ones (default 200) of ten kinds (sums, sorting, string and grid work), a fifth of
them wrong, each with `--cases` stdin/stdout cases (default 5). Both must agree on every verdict.
The last line is `stdio_speedup=<x> isolated=<true|false> per_case_ms=<sandbox ms per case>`.

Run: `python benchmarks/stdio.py [--programs N] [--cases K]` from the repository root.
"""

from __future__ import annotations

import argparse
import logging
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline.rewards._harness import outputs_match
from grpo_pipeline.rewards.code import IoLimits, stdio_job
from grpo_pipeline.rewards.code_formats import StdioCase
from grpo_pipeline.rewards.sandbox import Sandbox, SandboxConfig

logger = logging.getLogger("benchmarks.stdio")

# (program, its wrong twin, input generator, reference solution on the input text)
KINDS = [
    (
        "print(sum(map(int, input().split())))",
        "print(sum(map(int, input().split())) + 1)",
        lambda r: " ".join(str(r.randint(-99, 99)) for _ in range(r.randint(1, 9))),
        lambda s: str(sum(map(int, s.split()))),
    ),
    (
        "import sys\nxs = sorted(map(int, sys.stdin.read().split()[1:]))\nprint(*xs)",
        "import sys\nxs = sorted(map(int, sys.stdin.read().split()[1:]), reverse=True)\nprint(*xs)",
        lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}")(
            [r.randint(0, 50) for _ in range(r.randint(2, 8))]
        ),
        lambda s: " ".join(map(str, sorted(map(int, s.split()[1:])))),
    ),
    (
        "print(input()[::-1])",
        "print(input())",
        lambda r: "".join(r.choice("abcdef") for _ in range(r.randint(2, 12))),
        lambda s: s[::-1],
    ),
    (
        "n = int(input())\nfor i in range(1, n + 1):\n    print('*' * i)",
        "n = int(input())\nfor i in range(n):\n    print('*' * i)",
        lambda r: str(r.randint(1, 6)),
        lambda s: "\n".join("*" * i for i in range(1, int(s) + 1)),
    ),
    (
        "from collections import Counter\nc = Counter(input())\nprint(max(sorted(c), key=c.get))",
        "from collections import Counter\nc = Counter(input())\nprint(min(sorted(c), key=c.get))",
        lambda r: "".join(r.choice("aabbbc") for _ in range(r.randint(3, 10))),
        lambda s: max(sorted(set(s)), key=s.count),
    ),
    (
        "a, b = map(int, input().split())\nprint(a * b, a % b if b else 0)",
        "a, b = map(int, input().split())\nprint(a + b, a % b if b else 0)",
        lambda r: f"{r.randint(2, 40)} {r.randint(2, 9)}",
        lambda s: (lambda a, b: f"{a * b} {a % b}")(*map(int, s.split())),
    ),
    (
        "t = int(input())\nfor _ in range(t):\n    print(int(input()) ** 2)",
        "t = int(input())\nfor _ in range(t):\n    print(int(input()) * 2)",
        lambda r: (lambda xs: f"{len(xs)}\n" + "\n".join(map(str, xs)))(
            [r.randint(3, 30) for _ in range(r.randint(1, 5))]
        ),
        lambda s: "\n".join(str(int(x) ** 2) for x in s.split()[1:]),
    ),
    (
        "s = input()\nprint('YES' if s == s[::-1] else 'NO')",
        "s = input()\nprint('YES')",
        lambda r: r.choice(["abba", "abc", "racecar", "ab", "x"]),
        lambda s: "YES" if s == s[::-1] else "NO",
    ),
    (
        "import math\nprint(math.gcd(*map(int, input().split())))",
        "print(min(map(int, input().split())))",
        lambda r: f"{r.randint(2, 12) * 6} {r.randint(2, 12) * 4}",
        lambda s: str(__import__("math").gcd(*map(int, s.split()))),
    ),
    (
        "r, c = map(int, input().split())\ng = [input() for _ in range(r)]\nprint(sum(row.count('#') for row in g))",
        "r, c = map(int, input().split())\ng = [input() for _ in range(r)]\nprint(sum(row.count('.') for row in g))",
        lambda r: (lambda h, w: f"{h} {w}\n" + "\n".join("".join(r.choice("#.") for _ in range(w)) for _ in range(h)))(
            r.randint(1, 4), r.randint(1, 4)
        ),
        lambda s: str(sum(row.count("#") for row in s.split("\n")[1:])),
    ),
]


def make_programs(n: int, cases: int, seed: int = 0) -> list[tuple[str, list[StdioCase]]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        program, wrong, gen, solve = KINDS[i % len(KINDS)]
        inputs = [gen(rng) for _ in range(cases)]
        tests = [StdioCase(input=x + "\n", output=solve(x) + "\n") for x in inputs]
        out.append((wrong if rng.random() < 0.2 else program, tests))
    return out


def naive(programs: list[tuple[str, list[StdioCase]]], workers: int, timeout_s: float) -> list[bool]:
    """One `python program.py` subprocess per case, `workers` programs at a time."""

    def run(item: tuple[int, tuple[str, list[StdioCase]]], tmp: str) -> bool:
        i, (program, cases) = item
        path = Path(tmp) / f"program_{i}.py"
        path.write_text(program)
        for case in cases:
            try:
                r = subprocess.run(
                    [sys.executable, str(path)], input=case.input, capture_output=True, text=True, timeout=timeout_s
                )
            except subprocess.TimeoutExpired:
                return False
            if r.returncode != 0 or not outputs_match(r.stdout, case.output):
                return False
        return True

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda item: run(item, tmp), enumerate(programs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--cases", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=10.0, help="Per-case timeout (s).")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    programs = make_programs(args.programs, args.cases)
    io = IoLimits(case_timeout_s=args.timeout)
    jobs = [stdio_job(program, cases, io) for program, cases in programs]

    sandbox = Sandbox(SandboxConfig(timeout_s=args.timeout * args.cases))
    sandbox.run(jobs[:2])  # warm-up: the workers' sandboxes start once
    start = time.perf_counter()
    results = sandbox.run(jobs)
    sandbox_s = time.perf_counter() - start
    sandbox.close()
    ours = [r.score() == 1.0 for r in results]
    n_cases = sum(len(c) for _, c in programs)
    logger.info(
        "sandbox (isolated=%s, %d workers): %.2f s for %d programs x %d cases",
        sandbox.isolated,
        sandbox.workers,
        sandbox_s,
        len(programs),
        args.cases,
    )

    start = time.perf_counter()
    theirs = naive(programs, sandbox.workers, args.timeout)
    naive_s = time.perf_counter() - start
    logger.info("naive (python subprocess per case, %d at a time): %.2f s", sandbox.workers, naive_s)

    disagree = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    if disagree:
        sys.exit(f"verdicts disagree on {len(disagree)} programs: {disagree[:10]}")
    logger.info("verdicts agree on all %d programs (%d pass)", len(programs), sum(ours))
    print(
        f"stdio_speedup={naive_s / sandbox_s:.1f} isolated={str(sandbox.isolated).lower()} "
        f"per_case_ms={1000 * sandbox_s / n_cases:.2f}"
    )


if __name__ == "__main__":
    main()
