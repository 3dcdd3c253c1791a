"""The learning benchmark's report (benchmarks/learning.py) and the carry analysis (benchmarks/carry_errors.py): how
they count an addition model's wrong answers."""

from __future__ import annotations

import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from carry_errors import PROBLEMS, offset_counts, units_grid
from learning import wrong_by_offset


def model(rows: list[tuple[str, str]]) -> dict:
    """An eval's columns from (answer, greedy) pairs, greedy_correct as the evaluation scores it (exact match)."""
    return {
        "answers": [a for a, _ in rows],
        "greedy": [g for _, g in rows],
        "greedy_correct": [int(a == g) for a, g in rows],
    }


def test_wrong_answers_are_counted_by_their_offset_from_the_sum():
    rows = [("115", "105"), ("91", "81"), ("63", "73"), ("40", "41"), ("99", "77"), ("120", "12a"), ("57", "57")]
    assert wrong_by_offset(model(rows)) == "2 off by -10, 2 other, 1 off by +10, 1 off by +1"


def test_a_right_answer_is_not_counted_and_none_wrong_says_so():
    assert wrong_by_offset(model([("57", "57"), ("100", "100")])) == "none"
    # an answer that reads as the sum with a leading zero is not the sum the evaluation scores as right
    assert wrong_by_offset(model([("57", "057")])) == "1 other"


def test_carry_errors_sit_in_the_cells_of_their_units_digits():
    answers = [str(a + b) for a, b in PROBLEMS]
    wrong = {PROBLEMS.index((18, 27)): "35", PROBLEMS.index((38, 47)): "75", PROBLEMS.index((10, 10)): "30"}
    for i, answer in wrong.items():  # two carries dropped (units 8 + 7) and one +10 on a problem without a carry
        answers[i] = answer
    assert offset_counts(answers) == {"-10": 2, "+10": 1}
    grid = units_grid(answers)
    assert grid[8][7] == 2 and grid[0][0] == 1 and sum(map(sum, grid)) == 3
