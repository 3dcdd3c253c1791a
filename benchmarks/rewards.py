"""Benchmark: HumanEval canonical solutions through the naive method vs. the sandbox.

(a) naive: one `python -m pytest` subprocess per completion, one after another (the usual blog-post approach:
    write prompt + completion + test + `def test_check(): check(entry_point)` to a file and run pytest on it);
(b) the sandbox (rewards/sandbox/) with isolation on, programs in parallel on the usable cores.
Both must agree on every verdict. Prints both wall times; the last line is
`speedup=<x> isolated=<true|false> per_exec_ms=<y>` (per_exec_ms: sandbox wall time per program).

Run: `python benchmarks/rewards.py [--limit N]` from the repository root (needs ../shared/data/HumanEval.jsonl.gz).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline.rewards.code import humaneval_job
from grpo_pipeline.rewards.sandbox import Sandbox, SandboxConfig

logger = logging.getLogger("benchmarks.rewards")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "HumanEval.jsonl.gz"


def naive(rows: list[dict], timeout_s: float) -> list[bool]:
    """One pytest subprocess per completion."""
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in enumerate(rows):
            path = Path(tmp) / f"test_{i}.py"
            path.write_text(
                row["prompt"]
                + row["canonical_solution"]
                + "\n"
                + row["test"]
                + f"\n\ndef test_check():\n    check({row['entry_point']})\n"
            )
            try:
                r = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                    capture_output=True,
                    timeout=timeout_s + 10,
                    cwd=tmp,
                )
                verdicts.append(r.returncode == 0)
            except subprocess.TimeoutExpired:
                verdicts.append(False)
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="Use only the first N problems.")
    parser.add_argument("--timeout", type=float, default=10.0, help="Per-program timeout (s).")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not DATA.exists():
        sys.exit(f"{DATA} not found: put HumanEval.jsonl.gz in ../shared/data beside the repository")
    with gzip.open(DATA, "rt") as fh:
        rows = [json.loads(line) for line in fh][: args.limit]

    sandbox = Sandbox(SandboxConfig(timeout_s=args.timeout))
    jobs = [humaneval_job(r["prompt"], r["canonical_solution"], r["test"], r["entry_point"]) for r in rows]
    sandbox.run(jobs[:2])  # warm-up: thread pool, page cache, and the workers' sandboxes (started once, ~50 ms each)
    start = time.perf_counter()
    results = sandbox.run(jobs)
    sandbox_s = time.perf_counter() - start
    sandbox.close()
    ours = [r.score() == 1.0 for r in results]
    logger.info(
        "sandbox (isolated=%s, %d workers): %.2f s for %d programs",
        sandbox.isolated,
        sandbox.workers,
        sandbox_s,
        len(rows),
    )

    start = time.perf_counter()
    theirs = naive(rows, args.timeout)
    naive_s = time.perf_counter() - start
    logger.info("naive (pytest subprocess per completion): %.2f s for %d programs", naive_s, len(rows))

    disagree = [r["task_id"] for r, a, b in zip(rows, ours, theirs, strict=True) if a != b]
    if disagree:
        sys.exit(f"verdicts disagree on {len(disagree)} problems: {disagree[:10]}")
    logger.info("verdicts agree on all %d problems (%d pass)", len(rows), sum(ours))
    print(
        f"speedup={naive_s / sandbox_s:.1f} isolated={str(sandbox.isolated).lower()} "
        f"per_exec_ms={1000 * sandbox_s / len(rows):.1f}"
    )


if __name__ == "__main__":
    main()
