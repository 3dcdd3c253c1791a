"""Which calls of an assert list are the program's when its function under test is named like a builtin."""

from __future__ import annotations

import pytest

from grpo_pipeline.rewards.code_asserts import UNDER_TEST, builtins_under_test, mark_under_test


@pytest.mark.parametrize(
    ("asserts", "entry_point", "under_test"),
    [
        (("assert sum(10,15) == 6", "assert sum(4,6) == 3"), None, ("sum",)),  # MBPP task 126
        (("assert set(max([[1, 5]])) == set([5])",), None, ("max",)),  # `set` is applied to both sides
        (("assert sorted(sum([3, 1])) == [1, 3]",), None, ("sum",)),  # the innermost call takes the inputs
        (("assert sum(10, 15) == sum([1, 5])",), None, ("sum",)),  # only on both sides: the tested side's
        (("assert not any(x)",), None, ("any",)),
        # the program's own function is the one under test: no builtin is
        (("assert sorted(f([3, 1])) == sorted([1, 3])",), None, ()),
        (("assert round(area(2), 2) == 12.57",), None, ()),
        (("assert math.isclose(area(2), 12.57)",), None, ()),
        (("assert sum(10, 15) == 6",), "sum", ("sum",)),
        (("assert sorted(sum(x)) == [1]",), "sorted", ("sorted",)),  # the row's entry point decides
        (("assert sum(10, 15) == 6",), "gcd_sum", ()),
    ],
)
def test_the_function_under_test(
    asserts: tuple[str, ...], entry_point: str | None, under_test: tuple[str, ...]
) -> None:
    assert builtins_under_test(asserts, entry_point) == under_test


def test_only_the_tested_side_calls_the_program() -> None:
    marked = mark_under_test("assert sum(10, 15) == sum([1, 5]), sum([0])", ("sum",))
    assert marked == f"assert {UNDER_TEST}sum(10, 15) == sum([1, 5]), sum([0])"
    assert mark_under_test("assert set(max([[1]])) == set([1])", ("max",)) == (
        f"assert set({UNDER_TEST}max([[1]])) == set([1])"
    )
    unchanged = "assert  f(1)==2"
    assert mark_under_test(unchanged, ("sum",)) is unchanged
