"""End to end for the stdin/stdout and call-based formats: a benchmark file is loaded as `grpo-pipeline eval` loads
it (format detected from its columns), and the format's correctness reward scores a right program 1.0 and a wrong
one 0.0 on the mapped rows, with the test columns exactly as the loader kept them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from grpo_pipeline.rewards.registry import build_reward
from grpo_pipeline.tasks.scoring.formats import correctness_reward_for, load_eval_rows
from tests.test_code_io import CODECONTESTS, LCB_FUNCTIONAL, LCB_STDIN, OPEN_R1, TWO_SUM
from tests.test_eval_formats_io import apps_rows

pytestmark = pytest.mark.integration

ADD = "print(sum(map(int, input().split())))\n"
MULTIPLY = "a, b = map(int, input().split())\nprint(a * b)\n"

# format: (rows as published, a right program per row, a wrong program per row)
FILES: dict[str, tuple[list[dict[str, Any]], list[str], list[str]]] = {
    "apps": (
        apps_rows(),
        [ADD, "def total(xs):\n    return sum(xs)\n"],
        [MULTIPLY, "def total(xs):\n    return len(xs)\n"],
    ),
    "codecontests": (
        [
            {
                "name": "add",
                "description": "Print a + b.",
                **CODECONTESTS,
                "solutions": {"language": [3], "solution": [ADD]},
            }
        ],
        [ADD],
        [MULTIPLY],
    ),
    "livecodebench": (
        [
            {"question_title": "add", "question_content": "Print a + b.", "question_id": "1", **LCB_STDIN},
            {"question_title": "two sum", "question_content": "Two sum.", "question_id": "2", **LCB_FUNCTIONAL},
        ],
        [ADD, textwrap.dedent(TWO_SUM)],
        [MULTIPLY, "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"],
    ),
    "open-r1": (
        [{"problem_id": "1", "problem": "Print a + b.", **OPEN_R1}],
        [ADD],
        [MULTIPLY],
    ),
}


def _score(rows: pd.DataFrame, fmt: str, programs: list[str]) -> list[float | None]:
    reward = build_reward(correctness_reward_for(fmt).name, {"timeout_s": 20.0})
    columns = {c: rows[c].tolist() for c in rows.columns if c not in ("prompt", "completion")}
    return reward(rows["prompt"].tolist(), [f"```python\n{p}```" for p in programs], **columns)


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_a_benchmark_file_is_scored_as_its_checker_would(code_sandbox: None, tmp_path: Path, fmt: str) -> None:
    published, right, wrong = FILES[fmt]
    path = tmp_path / f"{fmt}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in published))
    rows, detected = load_eval_rows(path)
    assert detected == fmt and len(rows) == len(published)
    assert _score(rows, fmt, right) == [1.0] * len(rows)
    assert _score(rows, fmt, wrong) == [0.0] * len(rows)
