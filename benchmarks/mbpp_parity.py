"""Benchmark: the sandbox's verdicts on MBPP's canonical solutions against plain Python's.

For every row of an MBPP `mbpp.jsonl` (Austin et al. 2021; 974 rows of `text`, `code`, `task_id`,
`test_setup_code`, `test_list`, `challenge_test_list`), the canonical `code` is judged twice:
  (a) plain Python: `code`, then `test_setup_code`, then every assert of `test_list`, as one program run with
      `python -c` in a subprocess (MBPP's own order: the setup runs after the program, in its namespace); it
      passes when it exits 0 within `--timeout` seconds;
  (b) the `code_tests` reward (rewards/code.py) with the completion "```python\n<code>\n```" and the row's
      `test_list` and `test_setup_code` columns, in the bubblewrap sandbox; it passes on a score of 1.0.
Both use this interpreter. The table lists every row where they disagree, with plain Python's error and, when the
reward scored the row None, its `none_reasons` entry. The data is not shipped: pass the path of an mbpp.jsonl (e.g.
`mbpp/mbpp.jsonl` of the google-research repository).

Run: `python benchmarks/mbpp_parity.py /path/to/mbpp.jsonl [--timeout S] [--workers N]` from the repository root.
Task 123 (amicable numbers up to 9999) takes about 7 s of CPU in plain Python: with a 10 s limit on a loaded machine
plain Python times out where the sandbox passes, hence the 30 s default.
The last line is `mbpp_parity rows=<n> plain=<passes> sandbox=<passes> disagree=<k>`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline.rewards import build_reward


@dataclass
class Plain:
    passed: bool
    detail: str  # the last line of stderr, or "timeout", when it failed


def load_rows(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not JSON ({e})") from None
    return rows


def plain_program(row: dict) -> str:
    setup = row.get("test_setup_code") or ""
    return "\n".join([row["code"], setup, *row["test_list"]]) + "\n"


def run_plain(row: dict, timeout_s: float) -> Plain:
    try:
        done = subprocess.run(
            [sys.executable, "-c", plain_program(row)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except subprocess.TimeoutExpired:
        return Plain(False, f"timeout after {timeout_s:g}s")
    if done.returncode == 0:
        return Plain(True, "")
    tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return Plain(False, tail[-1] if tail else f"exit {done.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mbpp", help="path of an mbpp.jsonl")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per row, for both runs (default 30)")
    ap.add_argument("--workers", type=int, default=None, help="parallel runs (default: the CPU count)")
    args = ap.parse_args()

    rows = load_rows(args.mbpp)
    workers = args.workers or os.cpu_count() or 1

    with ThreadPoolExecutor(max_workers=workers) as pool:
        plain = list(pool.map(lambda r: run_plain(r, args.timeout), rows))

    reward = build_reward("code_tests", {"timeout_s": args.timeout, "workers": workers})
    prompts = [r.get("text", "") for r in rows]
    completions = [f"```python\n{r['code']}\n```" for r in rows]
    columns = {
        "test_list": [r["test_list"] for r in rows],
        "test_setup_code": [r.get("test_setup_code") or "" for r in rows],
    }
    scores = reward(prompts, completions, **columns)
    reasons = list(reward.none_reasons)

    sandbox_pass = [s == 1.0 for s in scores]
    disagree = [i for i in range(len(rows)) if plain[i].passed != sandbox_pass[i]]

    n_plain, n_sandbox = sum(p.passed for p in plain), sum(sandbox_pass)
    print(f"{'rows':<28}{len(rows)}")
    print(f"{'plain Python passes':<28}{n_plain}")
    print(f"{'sandbox (code_tests) passes':<28}{n_sandbox}")
    print(f"{'disagreements':<28}{len(disagree)}")
    plain_fail = [rows[i]["task_id"] for i in range(len(rows)) if not plain[i].passed]
    print(f"plain Python fails: task ids {plain_fail}")
    for i in range(len(rows)):
        if not plain[i].passed:
            print(f"  task {rows[i]['task_id']}: {plain[i].detail}")
    if disagree:
        print(f"{'task':>6}  {'plain':<6}{'sandbox':<9}why")
        for i in disagree:
            s = scores[i]
            shown = "None" if s is None else f"{s:g}"
            why = reasons[i] if s is None else (plain[i].detail or "plain Python passes")
            print(f"{rows[i]['task_id']:>6}  {'pass' if plain[i].passed else 'fail':<6}{shown:<9}{why}")
    print(f"mbpp_parity rows={len(rows)} plain={n_plain} sandbox={n_sandbox} disagree={len(disagree)}")


if __name__ == "__main__":
    main()
