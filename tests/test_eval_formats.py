"""Eval adapters (tasks/scoring/adapters.py) on the real GSM8K and HumanEval files in ../shared/data and on inline MATH
and MBPP rows: each format's gold answers score 1 through the reward that judges it, wrong ones 0, and pass@k from
those scores equals brute force. Tests that run programs in the sandbox are marked `integration`."""

from __future__ import annotations

import itertools
import random
import re
import subprocess
import sys
from fractions import Fraction
from math import comb
from pathlib import Path

import pandas as pd
import pytest

from grpo_pipeline.configs.eval import CORRECTNESS
from grpo_pipeline.configs.grpo import RewardSpec
from grpo_pipeline.rewards import REGISTRY, build_reward, build_spec
from grpo_pipeline.tasks.scoring.adapters import mbpp_prompt
from grpo_pipeline.tasks.scoring.formats import FORMATS, correctness_reward_for, detect_format, load_eval_rows
from grpo_pipeline.tasks.scoring.items import judge
from grpo_pipeline.tasks.scoring.metrics import mean_pass_at_k
from grpo_pipeline.tasks.sources import DataError

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GSM8K = DATA / "gsm8k_test.jsonl"
HUMANEVAL = DATA / "HumanEval.jsonl.gz"


def accuracy(correct: list[list[bool]]) -> float:
    return sum(c[0] for c in correct) / len(correct)


@pytest.fixture(scope="module")
def gsm8k() -> pd.DataFrame:
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} not found (../shared/data beside the repository)")
    rows, fmt = load_eval_rows(GSM8K)
    assert fmt == "gsm8k"
    return rows


@pytest.fixture(scope="module")
def humaneval() -> pd.DataFrame:
    if not HUMANEVAL.exists():
        pytest.skip(f"{HUMANEVAL} not found (../shared/data beside the repository)")
    rows, fmt = load_eval_rows(HUMANEVAL)
    assert fmt == "humaneval"
    return rows


# ----------------------------------------------------------------------------- formats and rewards


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (["task_id", "prompt", "canonical_solution", "test", "entry_point"], "humaneval"),
        (["task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list"], "mbpp"),
        (["source_file", "task_id", "prompt", "code", "test_imports", "test_list"], "mbpp"),  # sanitized MBPP
        (["question", "answer"], "gsm8k"),
        (["problem", "level", "type", "solution"], "boxed"),  # MATH
        (["problem", "solution", "answer", "subject", "level", "unique_id"], "boxed"),  # MATH-500
        (["problem", "answer"], "boxed"),
        (["prompt", "answer", "completion"], "columns"),
    ],
)
def test_detect_format(columns: list[str], expected: str) -> None:
    assert detect_format(columns) == expected


def test_detect_format_names_the_columns_and_the_formats() -> None:
    with pytest.raises(DataError) as e:
        detect_format(["query", "response"], origin="eval file x.jsonl")
    message = str(e.value)
    assert "eval file x.jsonl" in message and "['query', 'response']" in message
    assert all(fmt in message for fmt in FORMATS)
    assert "gsm8k (answer, question)" in message  # what gsm8k needs


def test_correctness_rewards_are_registered() -> None:
    assert {fmt: correctness_reward_for(fmt).name for fmt in FORMATS} == {
        "gsm8k": "correctness",
        "boxed": "correctness",
        "humaneval": "code_tests",
        "mbpp": "code_tests",
        "apps": "code_tests",
        "codecontests": "code_tests",
        "livecodebench": "code_tests",
        "open-r1": "code_tests",
        "columns": "correctness",
    }
    assert {correctness_reward_for(fmt).name for fmt in FORMATS} <= set(REGISTRY)
    # the math formats are judged by the very spec that eval.correctness_reward defaults to
    assert correctness_reward_for("gsm8k") is CORRECTNESS and isinstance(CORRECTNESS, RewardSpec)
    with pytest.raises(DataError, match="unknown eval format 'aime'"):
        correctness_reward_for("aime")


def test_module_imports_no_heavy_library() -> None:
    code = (
        "import sys, grpo_pipeline.tasks.scoring.formats; "
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- GSM8K


def test_gsm8k_answers_are_the_numbers_after_hashes(gsm8k: pd.DataFrame) -> None:
    assert len(gsm8k) == 1319 and list(gsm8k.columns) == ["id", "prompt", "answer"]
    assert all(re.fullmatch(r"-?\d+", a) for a in gsm8k["answer"])
    assert gsm8k["id"].tolist()[:3] == ["0", "1", "2"]  # no task_id in GSM8K: the row number
    assert gsm8k.loc[0, "answer"] == "18" and gsm8k.loc[0, "prompt"].startswith("Janet’s ducks lay 16 eggs")
    assert gsm8k.loc[611, "answer"] == "1450000"  # '#### 1,450,000': thousands commas dropped
    assert gsm8k.loc[489, "answer"] == "-10"
    assert len(load_eval_rows(GSM8K, "gsm8k", limit=7)[0]) == 7


def test_gsm8k_gold_scores_one_and_gold_plus_one_zero(gsm8k: pd.DataFrame) -> None:
    # both answer styles, on alternate rows: a sentence, and GSM8K's own '#### N' (both go through math-verify)
    styles = ["The answer is {}.", "#### {}"]
    completions = [[styles[i % 2].format(a), styles[i % 2].format(int(a) + 1)] for i, a in enumerate(gsm8k["answer"])]
    correct = judge(build_reward("correctness"), gsm8k, completions)[0]
    assert correct == [[True, False]] * 1319
    assert accuracy(correct) == 1.0 and accuracy([c[1:] for c in correct]) == 0.0


def test_gsm8k_accuracy_when_exactly_the_even_rows_are_right(gsm8k: pd.DataFrame) -> None:
    completions = [[f"The answer is {int(a) + i % 2}."] for i, a in enumerate(gsm8k["answer"])]
    correct = judge(build_reward("correctness"), gsm8k, completions)[0]
    assert [c[0] for c in correct] == [i % 2 == 0 for i in range(1319)]
    assert accuracy(correct) == 660 / 1319  # rows 0, 2, ..., 1318


COUNTS = [0, 1, 2, 3, 4, 5, 3, 1, 0, 5]  # correct samples (of N) per problem, every value from 0 to N
N = 5


def brute_force_pass_at_k(correct: list[list[bool]], k: int) -> Fraction:
    """Mean over problems of the fraction of k-subsets of its samples that hold at least one correct one."""
    per_problem = [
        Fraction(sum(any(s[i] for i in subset) for subset in itertools.combinations(range(len(s)), k)), comb(len(s), k))
        for s in correct
    ]
    return sum(per_problem, Fraction(0)) / len(per_problem)


def test_pass_at_k_equals_brute_force_over_scored_samples(gsm8k: pd.DataFrame) -> None:
    rows = gsm8k.head(len(COUNTS))
    rng = random.Random(0)
    right_at = [set(rng.sample(range(N), c)) for c in COUNTS]  # which samples are right, scattered
    completions = [
        [f"The answer is {int(a) + (j not in right)}." for j in range(N)]
        for a, right in zip(rows["answer"], right_at, strict=True)
    ]
    correct = judge(build_reward("correctness"), rows, completions)[0]
    assert correct == [[j in right for j in range(N)] for right in right_at]
    counts = [sum(c) for c in correct]
    assert counts == COUNTS
    expected = {k: brute_force_pass_at_k(correct, k) for k in (1, 2, 5)}
    assert expected[1] == Fraction(sum(COUNTS), N * len(COUNTS)) and expected[5] == Fraction(8, 10)
    for k, value in expected.items():
        # the product form is exact up to float rounding (a few ulp), the brute force exact in fractions
        assert mean_pass_at_k(counts, N, k) == pytest.approx(float(value), rel=0, abs=1e-12)


# ----------------------------------------------------------------------------- MATH-style boxed answers

MATH_ROWS = [
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": "Divide by 2: $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$."},
    {"problem": "Compute $\\sin 60^\\circ$.", "solution": "It is $\\boxed{\\dfrac{\\sqrt{3}}{2}}$."},
    {
        "problem": "Expand $(x+1)^2$.",
        "solution": "Not $\\boxed{x^2+1}$: the last box counts, $(x+1)^2 = \\boxed{x^{2}+2x+1}$.",
    },
    {"problem": "Solve $2^{x} = 8$.", "solution": "Since $8 = 2^3$, $x = \\boxed{3}$."},
]
MATH_GOLD = ["\\frac{1}{2}", "\\dfrac{\\sqrt{3}}{2}", "x^{2}+2x+1", "3"]
MATH_RIGHT = [
    "$\\boxed{\\frac{1}{2}}$",
    "So $\\boxed{\\frac{\\sqrt{3}}{2}}$.",
    "$\\boxed{x^2 + 2x + 1}$",
    "$x=\\boxed{3}$",
]
MATH_WRONG = ["$\\boxed{\\frac{1}{3}}$", "So $\\boxed{\\frac{\\sqrt{2}}{2}}$.", "$\\boxed{x^2+1}$", "$x=\\boxed{4}$"]


def test_boxed_answers_are_the_last_box_or_the_answer_column() -> None:
    rows, fmt = load_eval_rows(pd.DataFrame(MATH_ROWS))
    assert fmt == "boxed" and rows["answer"].tolist() == MATH_GOLD
    assert rows["prompt"].tolist() == [r["problem"] for r in MATH_ROWS] and rows["id"].tolist() == ["0", "1", "2", "3"]
    math500 = pd.DataFrame(MATH_ROWS[:2]).assign(answer=["0.5", ""], unique_id=["a", "b"])
    rows, _ = load_eval_rows(math500)
    assert rows["answer"].tolist() == ["0.5", "\\dfrac{\\sqrt{3}}{2}"]  # the column when given, else the box


def test_boxed_gold_scores_one_and_wrong_zero() -> None:
    rows, fmt = load_eval_rows(pd.DataFrame(MATH_ROWS))
    completions = [[right, wrong] for right, wrong in zip(MATH_RIGHT, MATH_WRONG, strict=True)]
    correct = judge(build_spec(correctness_reward_for(fmt)), rows, completions)[0]
    assert correct == [[True, False]] * len(MATH_ROWS)


# ----------------------------------------------------------------------------- HumanEval


def test_humaneval_rows_keep_prompt_tests_and_solution(humaneval: pd.DataFrame) -> None:
    raw = pd.read_json(HUMANEVAL, lines=True, dtype=False)
    assert len(humaneval) == 164
    assert list(humaneval.columns) == ["id", "prompt", "answer", "test", "entry_point"]
    assert humaneval["id"].tolist() == raw["task_id"].tolist() and humaneval.loc[0, "id"] == "HumanEval/0"
    assert humaneval["prompt"].tolist() == raw["prompt"].tolist()  # a continuation: unchanged
    assert humaneval["answer"].tolist() == raw["canonical_solution"].tolist()


@pytest.mark.integration
def test_humaneval_canonical_passes_and_unimplemented_fails(humaneval: pd.DataFrame, code_sandbox: None) -> None:
    # a generous wall clock: this checks verdicts, not speed, and the suite loads the cores with other tests
    reward = build_reward(correctness_reward_for("humaneval").name, {"timeout_s": 30})
    completions = [[solution, "    raise NotImplementedError\n"] for solution in humaneval["answer"]]
    correct = judge(reward, humaneval, completions)[0]
    failed = [i for i, (canonical, _) in zip(humaneval["id"], correct, strict=True) if not canonical]
    passed = [i for i, (_, broken) in zip(humaneval["id"], correct, strict=True) if broken]
    assert failed == [] and passed == []
    counts = [sum(c) for c in correct]
    assert accuracy(correct) == 1.0
    assert mean_pass_at_k(counts, 2, 1) == 0.5 and mean_pass_at_k(counts, 2, 2) == 1.0


# ----------------------------------------------------------------------------- MBPP

# Public MBPP rows (Austin et al. 2021; task ids 3, 11, 17 and 88, CRLF line ends kept as in the source), and one
# row of our own that needs its `test_setup_code`. Task 88 returns a collections.Counter that the asserts compare
# with a dict.
MBPP_ROWS = [
    {
        "task_id": 3,
        "text": "Write a python function to identify non-prime numbers.",
        "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n"
        "    for i in range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n            result = True\r\n"
        "    return result",
        "test_list": [
            "assert is_not_prime(2) == False",
            "assert is_not_prime(10) == True",
            "assert is_not_prime(35) == True",
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
        "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in range(len(s) - 1,-1,-1):  \r\n"
        "        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s ",
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 17,
        "text": "Write a function to find the perimeter of a square.",
        "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
        "test_list": [
            "assert square_perimeter(10)==40",
            "assert square_perimeter(5)==20",
            "assert square_perimeter(4)==16",
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 88,
        "text": "Write a function to get the frequency of the elements in a list.",
        "code": "import collections\r\ndef freq_count(list1):\r\n  freq_count= collections.Counter(list1)\r\n"
        "  return freq_count\r\n",
        "test_list": [
            "assert freq_count([10,10,10,10,20,20,20,20,40,40,50,50,30])==({10: 4, 20: 4, 40: 2, 50: 2, 30: 1})",
            "assert freq_count([1,2,3,4,3,2,4,1,3,1,4])==({1:3, 2:2,3:3,4:3})",
            "assert freq_count([5,6,7,4,9,10,4,5,6,7,9,5])==({10:1,5:3,6:2,7:2,4:2,9:2})",
        ],
        "test_setup_code": "",
    },
    {
        "task_id": "setup-1",
        "text": "Write a function that returns the number of sides of a named polygon.",
        "code": "def count_sides(name):\n    return {'triangle': 3, 'square': 4, 'hexagon': 6}[name]\n",
        "test_list": [
            "assert count_sides('square') == SIDES['square']",
            "assert count_sides('hexagon') == SIDES['hexagon']",
        ],
        "test_setup_code": "SIDES = {'triangle': 3, 'square': 4, 'hexagon': 6}",
    },
]
# Each fails at least one assert of its row (noted), so it must score 0.
MBPP_BROKEN = [
    "def is_not_prime(n):\n    return n % 2 == 0\n",  # is_not_prime(2) is True
    "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)\n",  # 'hello' -> 'helo'
    "def square_perimeter(a):\n    return a * a\n",  # 100 != 40
    "from collections import Counter\ndef freq_count(list1):\n    return Counter(set(list1))\n",  # all counts 1
    "def count_sides(name):\n    return len(name)\n",  # 'square' -> 6
]


def test_mbpp_rows_map_to_prompt_and_tests(tmp_path: Path) -> None:
    path = tmp_path / "mbpp.parquet"
    pd.DataFrame(MBPP_ROWS).astype({"task_id": str}).to_parquet(path)
    rows, fmt = load_eval_rows(path)  # Parquet gives arrays for the lists: they come back as lists of str
    assert fmt == "mbpp"
    assert list(rows.columns) == ["id", "prompt", "answer", "test_list", "test_setup_code"]
    assert rows["id"].tolist() == ["3", "11", "17", "88", "setup-1"]
    assert rows["test_list"].tolist() == [r["test_list"] for r in MBPP_ROWS]
    assert rows.loc[2, "prompt"] == (
        "Write a function to find the perimeter of a square.\nYour code should pass these tests:\n"
        "assert square_perimeter(10)==40\nassert square_perimeter(5)==20\nassert square_perimeter(4)==16\n"
    )
    assert rows.loc[2, "prompt"] == mbpp_prompt(MBPP_ROWS[2]["text"], MBPP_ROWS[2]["test_list"])
    assert rows["answer"].tolist() == [r["code"] for r in MBPP_ROWS]


def test_sanitized_mbpp_reads_prompt_and_test_imports() -> None:
    sanitized = pd.DataFrame(
        {
            "source_file": ["x"],
            "task_id": [17],
            "prompt": ["Write a function to find the perimeter of a square."],
            "code": [MBPP_ROWS[2]["code"]],
            "test_imports": [["import math", "import re"]],
            "test_list": [MBPP_ROWS[2]["test_list"]],
        }
    )
    rows, fmt = load_eval_rows(sanitized)
    assert fmt == "mbpp" and rows.loc[0, "test_setup_code"] == "import math\nimport re"
    assert rows.loc[0, "prompt"] == mbpp_prompt(MBPP_ROWS[2]["text"], MBPP_ROWS[2]["test_list"])


@pytest.mark.integration
def test_mbpp_canonical_scores_one_and_broken_zero(code_sandbox: None) -> None:
    rows, fmt = load_eval_rows(pd.DataFrame(MBPP_ROWS))
    reward = build_reward(correctness_reward_for(fmt).name, {"timeout_s": 5})
    completions = [[code, broken] for code, broken in zip(rows["answer"], MBPP_BROKEN, strict=True)]
    assert judge(reward, rows, completions)[0] == [[True, False]] * len(MBPP_ROWS)


# ----------------------------------------------------------------------------- errors


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    return path


def test_gsm8k_answer_without_hashes_names_file_and_rows(tmp_path: Path) -> None:
    answers = ["so 3\n#### 3", "it is 4", "#### 1,000", "no marker", "#### "]
    path = write_jsonl(tmp_path / "gsm.jsonl", [{"question": f"q{i}", "answer": a} for i, a in enumerate(answers)])
    with pytest.raises(DataError) as e:
        load_eval_rows(path)
    message = str(e.value)
    assert str(path) in message and "3 row(s) (counted from 0): 1, 3, 4." in message and "#### N" in message
    assert load_eval_rows(path, limit=1)[0]["answer"].tolist() == ["3"]  # only the rows asked for are checked


def test_many_bad_rows_are_counted_not_all_listed() -> None:
    raw = pd.DataFrame({"question": [f"q{i}" for i in range(9)], "answer": ["#### 1"] + ["1"] * 8})
    with pytest.raises(DataError, match=r"8 row\(s\) \(counted from 0\): 1, 2, 3, 4, 5 and 3 more"):
        load_eval_rows(raw)


def test_boxed_solution_without_box_names_the_rows() -> None:
    raw = pd.DataFrame([*MATH_ROWS, {"problem": "p", "solution": "it is 2"}, {"problem": "q", "solution": "\\boxed{}"}])
    with pytest.raises(DataError, match=r"the eval DataFrame: no answer.*2 row\(s\) \(counted from 0\): 4, 5\."):
        load_eval_rows(raw)


@pytest.mark.parametrize(
    ("raw", "fmt", "missing"),
    [
        (pd.DataFrame({"question": ["q"]}), "gsm8k", "['answer']"),
        (pd.DataFrame({"text": ["t"], "code": ["c"]}), "mbpp", "['test_list']"),
        (pd.DataFrame({"prompt": ["p"], "test": ["t"]}), "humaneval", "['entry_point']"),
        (pd.DataFrame({"question": ["q"], "answer": ["#### 1"]}), "boxed", "['problem']"),
    ],
)
def test_missing_column_for_an_explicit_format(raw: pd.DataFrame, fmt: str, missing: str) -> None:
    with pytest.raises(DataError) as e:
        load_eval_rows(raw, fmt)  # type: ignore[arg-type]
    assert f"has no column(s) {missing}, which format '{fmt}' needs" in str(e.value)
    assert f"columns seen: {list(raw.columns)}" in str(e.value)


def test_empty_values_and_bad_test_lists_name_the_rows(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "cols.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": None, "answer": "2"}])
    with pytest.raises(DataError, match=rf"eval file {re.escape(str(path))}: column 'prompt' is empty in 1 row.*: 1\."):
        load_eval_rows(path)
    mbpp = pd.DataFrame({"text": ["t", "u", "v"], "test_list": [["assert f() == 1"], [], "assert f() == 1"]})
    with pytest.raises(DataError, match=r"`test_list` is not a non-empty list.*2 row\(s\) \(counted from 0\): 1, 2\."):
        load_eval_rows(mbpp)


def test_unknown_columns_format_limit_and_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"the eval DataFrame has columns \['input', 'target'\], which match no"):
        load_eval_rows(pd.DataFrame({"input": ["1+1"], "target": ["2"]}))
    with pytest.raises(DataError, match="unknown eval format 'math'"):
        load_eval_rows(pd.DataFrame({"prompt": ["p"], "answer": ["1"]}), "math")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="limit must be at least 1"):
        load_eval_rows(pd.DataFrame({"prompt": ["p"], "answer": ["1"]}), limit=0)
    with pytest.raises(DataError, match="has no rows"):
        load_eval_rows(pd.DataFrame({"prompt": [], "answer": []}))
    with pytest.raises(DataError, match=re.escape(f"data file {tmp_path / 'none.jsonl'} does not exist")):
        load_eval_rows(tmp_path / "none.jsonl")


def test_columns_pass_through_keeps_extra_columns(tmp_path: Path) -> None:
    path = tmp_path / "own.csv"
    pd.DataFrame({"prompt": ["12+34=", "1+1="], "answer": ["46", "2"], "level": ["easy", "easy"]}).to_csv(
        path, index=False
    )
    rows, fmt = load_eval_rows(path)
    assert fmt == "columns" and correctness_reward_for(fmt) == CORRECTNESS
    assert rows.to_dict("list") == {
        "id": ["0", "1"],
        "prompt": ["12+34=", "1+1="],
        "answer": ["46", "2"],
        "level": ["easy", "easy"],
    }
