"""stdin/stdout tests judged as each dataset's own checker judges them (docs/rewards.md, "How stdout is compared").

The rules are plain functions of the harness (`outputs_match`), checked here case by case against what each checker
does (APPS's and LiveCodeBench's verdicts below were also compared with their `testing_util.py` over random
outputs); then through `code_tests` and real sandboxes, where each format's row carries its rule: the honest
program and its formatting variants score as the dataset's checker scores them, the wrong twin 0, and attempts to
cheat (an answer cut short, a token that makes the comparison raise) 0, never None.
"""

from __future__ import annotations

import base64
import json
import pickle
import re
import zlib
from pathlib import Path
from typing import Any

import pytest

from grpo_pipeline.rewards.code_formats import CODE_FORMATS, parse_tests
from grpo_pipeline.rewards.harness.compare import STDOUT_RULES, outputs_match
from grpo_pipeline.rewards.registry import build_reward

ROOT = Path(__file__).resolve().parents[1]

# (rule, stdout, expected output, passes): each line is what that dataset's checker says
CASES = [
    # LiveCodeBench: lines stripped; equal, or the same list of Decimals
    ("livecodebench", "1.50\n", "1.5\n", True),
    ("livecodebench", "3.0\n", "3\n", True),
    ("livecodebench", "1  2\n", "1 2\n", True),
    ("livecodebench", " 3\n", "3\n", True),
    ("livecodebench", "3\n\n\n", "3", True),
    ("livecodebench", "1e1\n", "10\n", True),
    ("livecodebench", "1.5000001\n", "1.5\n", False),  # exact Decimals: no tolerance
    ("livecodebench", "YES\n", "yes\n", False),
    ("livecodebench", "2 1\n", "1 2\n", False),
    ("livecodebench", "3\n", "3\n7\n", False),  # line counts must match
    ("livecodebench", "3\n\n7\n", "3\n7\n", False),
    ("livecodebench", "NaN\n", "NaN\n", True),  # equal as text
    ("livecodebench", "NaN 1\n", "NaN 2\n", False),
    ("livecodebench", "sNaN 1\n", "sNaN 2\n", False),  # comparing a signalling NaN raises: a wrong answer
    # APPS: the whole output trimmed, then its cascade (allclose per line, sets of token sets, rounding)
    ("apps", " 3\n", "3\n", True),
    ("apps", "1.50\n", "1.5\n", True),
    ("apps", "1.5000001\n", "1.5\n", True),  # np.allclose, rtol 1e-5
    ("apps", "1.501\n", "1.5\n", False),
    ("apps", "1  2\n", "1 2\n", True),
    ("apps", "2 1\n", "1 2\n", True),  # a set of each line's tokens: order is ignored
    ("apps", "3\n", "3\n7\n", False),
    ("apps", "3\n\n7\n", "3\n7\n", True),  # empty lines are dropped
    ("apps", "YES\n", "yes\n", False),
    # CodeContests: tokens, ASCII-lowercased; numbers within 1e-5
    ("codecontests", "YES\n", "yes\n", True),
    ("codecontests", "1 2", "1\n2\n", True),
    ("codecontests", "0.333333\n", "0.3333333\n", True),
    ("codecontests", "0.3333\n", "0.3333333\n", False),
    ("codecontests", "2 1\n", "1 2\n", False),
    ("codecontests", "1_000\n", "1000\n", False),  # absl reads no `_`: compared as text
    ("codecontests", "inf\n", "inf\n", True),
    # open-r1: stdout stripped, lines stripped and equal; here as many lines as expected
    ("open-r1", " 3 \n", "3\n", True),
    ("open-r1", "1.50\n", "1.5\n", False),
    ("open-r1", "1  2\n", "1 2\n", False),
    ("open-r1", "3\n", "3\n7\n", False),  # open-r1's zip would pass it: the answer cut short
    ("open-r1", "3\n7\n", "3\n", False),
    ("open-r1", "", "\n", True),
    # rows of no known dataset: line by line, trailing whitespace ignored
    ("lines", "3   \n\n", "3", True),
    ("lines", " 3\n", "3\n", False),
]


@pytest.mark.parametrize(("rule", "got", "expected", "passes"), CASES)
def test_each_rule_judges_as_its_checker(rule: str, got: str, expected: str, passes: bool) -> None:
    assert outputs_match(got, expected, rule) is passes


def test_a_tolerance_widens_any_rule_and_an_unknown_rule_is_an_error() -> None:
    assert not outputs_match("0.3334\n", "0.3333\n", "livecodebench")
    assert outputs_match("0.3334\n", "0.3333\n", "livecodebench", float_tolerance=1e-3)
    with pytest.raises(KeyError):
        outputs_match("3", "3", "no-such-rule")


def test_every_stdin_format_names_a_rule_the_harness_has_and_the_docs_list() -> None:
    assert {fmt.stdout_rule for fmt in CODE_FORMATS} | {"lines"} == set(STDOUT_RULES)
    docs = (ROOT / "docs" / "rewards.md").read_text()
    table = docs[docs.index("### How stdout is compared") :]
    for rule in STDOUT_RULES:
        assert re.search(rf"^\| `{re.escape(rule)}` \|", table, re.MULTILINE), f"docs/rewards.md has no row for {rule}"


def lcb_private(cases: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


# One problem in every format: read a b, print a / b and then "min max". Input "3 2" -> "1.5" and "2 3".
INPUTS, OUTPUTS = ["3 2\n", "8 5\n"], ["1.5\n2 3\n", "1.6\n5 8\n"]
LCB_CASES = [{"input": i, "output": o, "testtype": "stdin"} for i, o in zip(INPUTS, OUTPUTS, strict=True)]
ROWS: dict[str, dict[str, Any]] = {
    "apps": {"input_output": json.dumps({"inputs": INPUTS, "outputs": OUTPUTS})},
    "livecodebench": {"public_test_cases": json.dumps(LCB_CASES[:1]), "private_test_cases": lcb_private(LCB_CASES)},
    "codecontests": {"public_tests": {"input": INPUTS[:1], "output": OUTPUTS[:1]}, "private_tests": {
        "input": INPUTS[1:], "output": OUTPUTS[1:]}},
    "open-r1": {"verification_info": json.dumps({"language": "python", "test_cases": [
        {"input": i, "output": o, "type": "stdin_stdout"} for i, o in zip(INPUTS, OUTPUTS, strict=True)]})},
}  # fmt: skip
READ = "a, b = map(int, input().split())\n"
PROGRAMS = {  # name: (program, the score under apps, livecodebench, codecontests, open-r1)
    "honest": (READ + "print(a / b)\nprint(min(a, b), max(a, b))\n", (1, 1, 1, 1)),
    "two decimals, two spaces": (READ + "print(f'{a / b:.2f}')\nprint(min(a, b), '', max(a, b))\n", (1, 1, 1, 0)),
    "leading spaces": (READ + "print('', a / b)\nprint('', min(a, b), max(a, b))\n", (1, 1, 1, 1)),
    "wrong twin": (READ + "print(a / b + 0.1)\nprint(min(a, b), max(a, b))\n", (0, 0, 0, 0)),
    "pair in the wrong order": (READ + "print(a / b)\nprint(max(a, b), min(a, b))\n", (1, 0, 0, 0)),
    "cut short (open-r1's zip passes it)": (READ + "print(a / b)\n", (0, 0, 0, 0)),
    "a signalling NaN": (READ + "print('sNaN')\nprint(min(a, b), max(a, b))\n", (0, 0, 0, 0)),
    "right answer, then a crash": (READ + "print(a / b)\nprint(min(a, b), max(a, b))\n1 / 0\n", (0, 0, 0, 0)),
}  # fmt: skip


def test_each_format_carries_its_rule() -> None:
    for fmt, columns in ROWS.items():
        parsed = parse_tests(columns)
        assert parsed is not None and parsed.stdout_rule == fmt


@pytest.fixture(scope="module")
def code_tests(code_sandbox: None) -> Any:
    return build_reward("code_tests", {"timeout_s": 20.0, "case_timeout_s": 5.0})


@pytest.mark.integration
@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_programs_score_as_the_datasets_checker_scores_them(code_tests: Any, fmt: str) -> None:
    column = ("apps", "livecodebench", "codecontests", "open-r1").index(fmt)
    names = sorted(PROGRAMS)
    programs = [PROGRAMS[n][0] for n in names]
    columns = {k: [v] * len(programs) for k, v in ROWS[fmt].items()}
    scores = code_tests(["Solve it."] * len(programs), programs, **columns)
    assert dict(zip(names, scores, strict=True)) == {n: float(PROGRAMS[n][1][column]) for n in names}
