"""The dense arithmetic reward: partial credit per digit, aligned from the units digit."""

import pytest

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.arith import digit_match_score


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [
        ("55", "55", 1.0),
        ("56", "55", 0.5),  # units wrong, tens right
        ("45", "55", 0.5),  # a carry error in the tens costs one position
        ("155", "55", 2 / 3),  # an extra digit costs its position
        ("5", "55", 0.5),  # a missing digit too
        ("99", "55", 0.0),
        (" 55 ", "55", 1.0),  # surrounding whitespace is ignored
        ("-7", "-7", 1.0),
        ("7", "-7", 0.0),  # sign mismatch
        ("55abc", "55", 0.0),  # text around the number breaks the format
        ("", "55", 0.0),
        ("1,055", "1055", 0.0),
    ],
)
def test_digit_match_score(predicted, gold, expected):
    assert digit_match_score(predicted, gold) == pytest.approx(expected)


def test_digit_match_is_registered_and_scores_a_batch():
    reward = build_reward("digit_match")
    assert reward.__name__ == "digit_match"
    scores = reward(prompts=["47+8=", "47+8=", "9+9="], completions=["55", "54", "18"], answer=["55", "55", "18"])
    assert scores == [1.0, 0.5, 1.0]


def test_digit_match_agrees_with_correctness_on_exact_answers():
    digit, exact = build_reward("digit_match"), build_reward("correctness")
    completions, answers = ["55", "54", "018", "100"], ["55", "55", "18", "100"]
    d = digit(prompts=[""] * 4, completions=completions, answer=answers)
    e = exact(prompts=[""] * 4, completions=completions, answer=answers)
    # Full digit credit only for the exact string; "018" is numerically right but has a leading zero.
    assert [x == 1.0 for x in d] == [True, False, False, True]
    assert e[0] == e[3] == 1.0 and e[1] == 0.0
