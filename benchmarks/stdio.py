"""Benchmark: stdin/stdout tests in the sandbox vs one `python` subprocess per test case.

(a) naive: what local runners in this field do: write the program to a file and run `python program.py` once per
    test case with the input on stdin (`subprocess.run(..., input=..., timeout=...)`), no isolation; the same
    number of programs in parallel as the sandbox has workers, so the ratio is per core, not a parallelism gain;
(b) the `code_tests` reward's sandbox (rewards/sandbox/) with isolation on: one fork per case from a launcher
    whose Python is already started.
Programs: `--programs` generated ones (default 200) of ten kinds (sums, sorting, string and grid work), a fifth of
them wrong, each with `--cases` stdin/stdout cases (default 5). Both must agree on every verdict.
The last line is `stdio_speedup=<x> isolated=<true|false> per_case_ms=<sandbox ms per case> cpu_speedup=<x>
cpu_per_case_ms=<ms>`: wall-clock and CPU time (of this process and every process it started, the sandboxes'
included). Other work on the machine moves the wall-clock ratio a lot (6-17x on 2 cores shared with test runs);
the CPU ratio much less.

Run: `python benchmarks/stdio.py [--programs N] [--cases K]` from the repository root.

Before/after in one run: `--before OLD` times the sandbox with another harness too, in alternating rounds with the
current one (`--rounds`, median of each), so both see the same load; a line `before: ...` with the same fields then
precedes the last line. OLD is a harness package folder, joined as the sandbox joins rewards/harness/ (e.g.
`mkdir /tmp/old && git archive <rev> rewards/harness | tar -x -C /tmp/old`, then `--before /tmp/old/rewards/harness`),
or one source file: the harness before it was split into modules (`git show <rev>:rewards/_harness.py > /tmp/old.py`).
A harness from before its config moved from argv to stdin gets a first line that reads it from stdin.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline import python_ast
from grpo_pipeline.rewards.code import IoLimits, stdio_job
from grpo_pipeline.rewards.code_formats import StdioCase
from grpo_pipeline.rewards.harness import program_source
from grpo_pipeline.rewards.harness.compare import outputs_match
from grpo_pipeline.rewards.sandbox import Sandbox, SandboxConfig
from grpo_pipeline.rewards.sandbox import config as sandbox_config

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


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root`'s descendants so far, with what each has reaped (a worker's fork server reaps every
    process of its programs, so its children's times hold theirs)."""
    children: dict[int, list[tuple[int, list[str]]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append((int(name), fields))
    ticks, stack = 0, [root]
    while stack:
        for pid, fields in children.get(stack.pop(), []):
            ticks += sum(int(t) for t in fields[11:15])  # utime, stime, cutime, cstime
            stack.append(pid)
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_s(children: bool = False) -> float:
    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)


def time_sandbox(jobs: list, timeout_s: float, harness: str | None = None) -> tuple[float, float, list, Sandbox]:
    """Seconds and CPU seconds (this process and the sandboxes') for the sandbox to run `jobs` (after a warm-up
    that starts its workers), the results and the sandbox; `harness`: another harness's source (`--before`)."""
    current = sandbox_config.HARNESS_SOURCE
    if harness is not None:
        sandbox_config.HARNESS_SOURCE = harness
    try:
        sandbox = Sandbox(SandboxConfig(timeout_s=timeout_s))
        sandbox.run(jobs[:2])  # warm-up: the workers' sandboxes start once
        roots = [w.proc.pid for w in sandbox._workers if w is not None]
        cpu, start = own_cpu_s() + sum(map(tree_cpu_s, roots)), time.perf_counter()
        results = sandbox.run(jobs)
        seconds = time.perf_counter() - start
        cpu = own_cpu_s() + sum(map(tree_cpu_s, roots)) - cpu
        sandbox.close()
    finally:
        sandbox_config.HARNESS_SOURCE = current
    return seconds, cpu, results, sandbox


def harness_at(folder: Path) -> str:
    """The program of the harness package in `folder` (another revision's), its modules joined in the order its own
    `__init__.py` names (`MODULES`)."""
    tree = python_ast.parse((folder / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MODULES" for t in node.targets):
            return program_source(folder, ast.literal_eval(node.value))
    sys.exit(f"{folder}/__init__.py names no MODULES: not a harness package")


def config_on_stdin(source: str) -> str:
    """`source`, where it is a harness that read its config from `sys.argv[1]` (before the host wrote it on the
    harness's stdin, rewards/harness/server.py), with a first line that puts it there from stdin."""
    if "sys.argv[1]" not in source:
        return source
    shim = (
        "import os as _os, sys as _sys\n_sys.argv[1:] = [b''.join(iter(lambda: _os.read(0, 1 << 16), b'')).decode()]\n"
    )
    future = "from __future__ import annotations\n"  # must stay the first statement
    head, sep, rest = source.partition(future)
    return head + sep + shim + rest if sep else shim + source


def timed_rounds(jobs: list, timeout_s: float, before: str | None, rounds: int) -> tuple[dict, list, Sandbox]:
    """{"after": [(seconds, CPU seconds) per round], "before": [...]}, the current harness's results and its
    sandbox; with a `before` harness, `rounds` alternating rounds of each (both must give the same verdicts)."""
    times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for _ in range(rounds if before else 1):
        if before:
            seconds, cpu, old, _ = time_sandbox(jobs, timeout_s, before)
            times["before"].append((seconds, cpu))
        seconds, cpu, results, sandbox = time_sandbox(jobs, timeout_s)
        times["after"].append((seconds, cpu))
        if before and [r.score() for r in old] != [r.score() for r in results]:
            sys.exit("the --before harness and the current one disagree on some verdicts")
    return times, results, sandbox


def ratios(naive: tuple[float, float], ours: tuple[float, float], n_cases: int, isolated: bool | None = None) -> str:
    """The result line: wall-clock and CPU speedups over the naive runner, and the sandbox's ms per case."""
    where = "" if isolated is None else f" isolated={str(isolated).lower()}"
    return (
        f"stdio_speedup={naive[0] / ours[0]:.1f}{where} per_case_ms={1000 * ours[0] / n_cases:.2f} "
        f"cpu_speedup={naive[1] / ours[1]:.1f} cpu_per_case_ms={1000 * ours[1] / n_cases:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--cases", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=10.0, help="Per-case timeout (s).")
    parser.add_argument("--before", type=Path, help="Another harness (a package folder or one source file), timed too.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds with --before.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    programs = make_programs(args.programs, args.cases)
    io = IoLimits(case_timeout_s=args.timeout)
    jobs = [stdio_job(program, cases, io) for program, cases in programs]
    n_cases = sum(len(c) for _, c in programs)

    before = None
    if args.before:
        before = config_on_stdin(harness_at(args.before) if args.before.is_dir() else args.before.read_text())
    times, results, sandbox = timed_rounds(jobs, args.timeout * args.cases, before, args.rounds)
    sandbox_s, sandbox_cpu = (statistics.median(t[i] for t in times["after"]) for i in (0, 1))
    ours = [r.score() == 1.0 for r in results]
    logger.info("sandbox (isolated=%s, %d workers): %.2f s (%.2f s of CPU) for %d programs x %d cases",
                sandbox.isolated, sandbox.workers, sandbox_s, sandbox_cpu, len(programs), args.cases)  # fmt: skip

    cpu, start = own_cpu_s(children=True), time.perf_counter()
    theirs = naive(programs, sandbox.workers, args.timeout)
    naive_s, naive_cpu = time.perf_counter() - start, own_cpu_s(children=True) - cpu
    logger.info("naive (python subprocess per case, %d at a time): %.2f s (%.2f s of CPU)",
                sandbox.workers, naive_s, naive_cpu)  # fmt: skip

    disagree = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    if disagree:
        sys.exit(f"verdicts disagree on {len(disagree)} programs: {disagree[:10]}")
    logger.info("verdicts agree on all %d programs (%d pass)", len(programs), sum(ours))
    if before:
        before_s, before_cpu = (statistics.median(t[i] for t in times["before"]) for i in (0, 1))
        logger.info("rounds (s, CPU s): before %s, after %s", [f"{a:.2f}, {b:.2f}" for a, b in times["before"]],
                    [f"{a:.2f}, {b:.2f}" for a, b in times["after"]])  # fmt: skip
        print("before:", ratios((naive_s, naive_cpu), (before_s, before_cpu), n_cases))
    print(ratios((naive_s, naive_cpu), (sandbox_s, sandbox_cpu), n_cases, sandbox.isolated))


if __name__ == "__main__":
    main()
