"""Commas in math answers (rewards/math.py): thousands separators only where a number is written that way, lists
compared as ordered lists unless the reference is a set."""

from __future__ import annotations

import pytest

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.math import answer_key, extract_gold, split_list


@pytest.fixture(scope="module")
def correctness():
    fn = build_reward("correctness")

    def score(completion: str, answer: str) -> float | None:
        return fn(prompts=[""], completions=[completion], answer=[answer])[0]

    return score


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"\boxed{2,3}", "23", 0.0),  # a list, not 23 with a thousands separator
        ("<answer>2,3</answer>", "23", 0.0),
        ("<answer>2,3</answer>", "2.3", 0.0),  # nor a decimal comma
        ("1,23", "123", 0.0),  # not a thousands group: a list of two numbers
        (r"\boxed{1,234}", "1234", 1.0),
        (r"\boxed{12,345,678}", "12345678", 1.0),
        (r"\boxed{2,300}", "2,3", 0.0),
        (r"\boxed{2, 3}", "2,3", 1.0),
        ("2, 3", "2,3", 1.0),
        ("3,2", "2,3", 0.0),  # lists are ordered ...
        (r"\boxed{3,2}", "2,3", 0.0),
        (r"\boxed{3,2}", r"\{2,3\}", 1.0),  # ... unless the reference is a set
        (r"\boxed{1,2,3}", "1,2", 0.0),
        (r"\boxed{\frac{1}{2}, 3}", "0.5, 3", 1.0),  # items that are not plain numbers go to math-verify
        (r"\boxed{x=1, y=2}", "x=1,y=2", 1.0),
        ("First, add them, so 5", "2,3", 0.0),  # prose with commas is not a list
    ],
)
def test_commas(correctness, completion: str, answer: str, expected: float) -> None:
    assert correctness(completion, answer) == expected


def test_gsm8k_gold_with_thousands_separators_still_works(correctness) -> None:
    gold = "She earns 1,000 + 234 = 1,234 dollars.\n#### 1,234"
    assert extract_gold(gold) == "1234"
    assert correctness("<answer>1234</answer>", gold) == 1.0
    assert correctness("The answer is 1,234.", gold) == 1.0
    assert correctness(r"so \boxed{1,234}", gold) == 1.0
    assert correctness("<answer>1,243</answer>", gold) == 0.0
    assert extract_gold("#### 2,3") == "2,3"  # not a number with separators: kept as the list it is


def test_split_list() -> None:
    assert split_list("2,3") == ["2", "3"]
    assert split_list(r"$x=1, y=\frac{1}{2}$.") == ["x=1", r"y=\frac{1}{2}"]
    assert split_list("f(1,2), 3") == ["f(1,2)", "3"]
    for one_value in ["1,234", "12,345,678", r"\{2,3\}", "(2,3)", "[1, 2]", "42", "", "2,"]:
        assert split_list(one_value) is None, one_value


def test_answer_keys_keep_lists_apart_from_numbers() -> None:
    assert answer_key(r"\boxed{2,3}") != answer_key("23")
    assert answer_key(r"\boxed{2, 3}") == answer_key(r"\boxed{2,3}")
    assert answer_key("a total of 1,234") == answer_key("1234")
    assert answer_key("the roots are 2,3") == "3"  # the last number, not 23
