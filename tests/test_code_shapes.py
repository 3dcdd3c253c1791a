"""Plain-Python semantics for the shapes honest programs take, and verdicts no program can forge.

Each shape is checked with its honest program (1.0, as `prompt + program + tests` in one Python process would give)
and its wrong twin (0.0), through the `code_tests` reward and real sandboxes:
  - assert lists never call a builtin or standard-library name the program redefines (`def set(*a)`);
  - arguments mutated in place are copied back into the tests' objects (nested ones too);
  - objects, closures and classes of the program reach the tests as handles (method calls and attribute reads go
    back to the program's process; a handle equals only itself);
  - callables and builtin types passed by the tests reach the program;
  - `test_setup_code` builds the program's own objects (`root = Node(1)`);
  - expression entry points (`Solution().twoSum`);
  - `python prog.py`'s `sys.argv` and `__file__` in every call-based runner (HumanEval, MBPP, LeetCode, APPS).
"""

from __future__ import annotations

import builtins
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.rewards.registry import build_reward

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def code_tests(code_sandbox: None) -> Any:
    return build_reward("code_tests", {"timeout_s": 20.0})


def mbpp(program: str, asserts: list[str], setup: str = "") -> dict[str, Any]:
    return {"completion": textwrap.dedent(program), "test_list": asserts, "test_setup_code": textwrap.dedent(setup)}


def humaneval(program: str, check: str, entry_point: str, prompt: str = "") -> dict[str, Any]:
    return {
        "prompt": prompt,
        "completion": textwrap.dedent(program),
        "test": textwrap.dedent(check),
        "entry_point": entry_point,
    }


def score_all(reward: Any, rows: list[dict[str, Any]]) -> list[float | None]:
    """One reward call over rows of one style (the columns a row lacks are None, as in a mixed dataset)."""
    keys = sorted({k for r in rows for k in r} - {"prompt", "completion"})
    columns = {k: [r.get(k) for r in rows] for k in keys}
    return reward([r.get("prompt", "") for r in rows], [r["completion"] for r in rows], **columns)


# ------------------------------------------------------------------ forged verdicts on assert lists
PUBLIC_BUILTINS = sorted(n for n in dir(builtins) if not n.startswith("_"))


def test_every_builtin_an_assert_uses_is_the_real_one(code_tests: Any) -> None:
    """A wrong program that redefines the builtin an assert calls, to return what the assert expects, scores 0."""
    rows = [
        mbpp(
            f"def f(x):\n    return None\ndef {name}(*a, **k):\n    return 'forged'\n",
            [f"assert {name}(f(1)) == 'forged'"],
        )
        for name in PUBLIC_BUILTINS
    ]
    scores = score_all(code_tests, rows)
    forged = [name for name, s in zip(PUBLIC_BUILTINS, scores, strict=True) if s != 0.0]
    assert len(rows) > 100 and forged == []


STDLIB_CALLS = {  # module: an attribute that MBPP-style asserts call
    "math": "isclose",
    "cmath": "isclose",
    "re": "match",
    "collections": "Counter",
    "heapq": "nlargest",
    "itertools": "chain",
    "functools": "reduce",
    "operator": "neg",
    "string": "capwords",
    "statistics": "mean",
    "json": "dumps",
    "bisect": "bisect",
    "decimal": "Decimal",
    "fractions": "Fraction",
    "datetime": "date",
}


def test_every_stdlib_module_an_assert_uses_is_the_real_one(code_tests: Any) -> None:
    rows = [
        mbpp(
            f"def f(x):\n    return None\nclass {module}:\n    {attr} = staticmethod(lambda *a, **k: 'forged')\n",
            [f"assert {module}.{attr}(f(1)) == 'forged'"],
        )
        for module, attr in STDLIB_CALLS.items()
    ]
    assert score_all(code_tests, rows) == [0.0] * len(rows)


def test_the_reported_forgeries_score_0_and_their_honest_twins_1(code_tests: Any) -> None:
    rows = [
        mbpp("def similar_elements(a, b):\n    return None\ndef set(*a):\n    return 0\n",
             ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))"]),
        mbpp("def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
             ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))"]),
        mbpp("def area(r):\n    return 1\ndef round(x, n):\n    return 12.57\n", ["assert round(area(2), 2) == 12.57"]),
        mbpp("import math\ndef area(r):\n    return math.pi * r * r\n", ["assert round(area(2), 2) == 12.57"]),
        # a program's function named like a module the asserts do not use as a module is still the program's
        mbpp("def random(n):\n    return n * 2\n", ["assert random(3) == 6"]),
    ]  # fmt: skip
    assert score_all(code_tests, rows) == [0.0, 1.0, 0.0, 1.0, 1.0]


# ------------------------------------------------------------------ functions under test named like builtins
# MBPP task 126, as published: the function under test is named `sum` (the sum of common divisors).
MBPP_126 = ["assert sum(10,15) == 6", "assert sum(100,150) == 93", "assert sum(4,6) == 3"]
SUM_OF_COMMON_DIVISORS = """
    def sum(a, b):
        total = 0
        for i in range(1, min(a, b)):
            if a % i == 0 and b % i == 0:
                total += i
        return total
"""
# A function under test named `max` (the largest of each sublist) whose asserts apply `set` to both sides.
MAX_EACH = ["assert set(max([[1, 5], [3]])) == set([5, 3])", "assert set(max([[2], [9, 4]])) == set([2, 9])"]
MAX_OF_EACH = "import builtins\ndef max(lists):\n    return [builtins.max(x) for x in lists]\n"


def test_builtin_named_functions_under_test_score_as_in_the_authors_run(code_tests: Any) -> None:
    """The honest rows pass, their wrong twins fail, and a program that also redefines the builtin the asserts
    apply to both sides (`set`) to make its wrong answer pass still fails: only the call under test is the
    program's."""
    rows = [
        mbpp(SUM_OF_COMMON_DIVISORS, MBPP_126),
        mbpp("def sum(a, b):\n    return a + b\n", MBPP_126),  # the wrong twin
        mbpp("def sum_divisors(a, b):\n    return 6\n", MBPP_126),  # no `sum` of its own: the builtin raises
        mbpp(MAX_OF_EACH, MAX_EACH),
        mbpp("def max(lists):\n    return [0]\n", MAX_EACH),  # the wrong twin
        # the cheat: a wrong `max` and a `set` that makes both sides equal; `set` stays the real one
        mbpp("def max(lists):\n    return [0]\ndef set(*a):\n    return 0\n", MAX_EACH),
        # the row names its function: the asserts' expected side keeps the builtin of the same name
        {**mbpp(SUM_OF_COMMON_DIVISORS, ["assert sum(10, 15) == sum([1, 5])"]), "entry_point": "sum"},
        {**mbpp("def sum(*a):\n    return 7\n", ["assert sum(10, 15) == sum([1, 5])"]), "entry_point": "sum"},
    ]
    assert score_all(code_tests, rows) == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_redefined_builtins_applied_to_both_sides_never_forge_a_pass(code_tests: Any) -> None:
    """`assert sorted(f(x)) == sorted([...])`: a wrong `f` with a `sorted` (`set`, `len`) that makes both sides
    equal fails; its honest twin passes."""
    shapes = {
        "sorted": ("assert sorted(f([3, 1, 2])) == sorted([1, 2, 3])", "def f(x):\n    return list(x)\n"),
        "set": ("assert set(f([3, 1, 2])) == set([1, 2, 3])", "def f(x):\n    return list(x)\n"),
        "len": ("assert len(f('abc')) == len('xyz')", "def f(x):\n    return x[::-1]\n"),
    }
    rows = []
    for name, (test, honest) in shapes.items():
        rows.append(mbpp(honest, [test]))
        rows.append(mbpp(f"def f(x):\n    return [9]\ndef {name}(*a):\n    return 1\n", [test]))
    assert score_all(code_tests, rows) == [1.0, 0.0] * len(shapes)


def test_call_based_entry_named_like_a_builtin_is_the_programs(code_tests: Any) -> None:
    calls = json.dumps({"inputs": [[10, 15], [4, 6]], "outputs": [6, 3], "fn_name": "sum"})
    programs = [SUM_OF_COMMON_DIVISORS, "def sum(a, b):\n    return a + b\n"]
    rows = [{"completion": textwrap.dedent(p), "input_output": calls} for p in programs]
    assert score_all(code_tests, rows) == [1.0, 0.0]


def test_an_eq_that_always_agrees_does_not_pass(code_tests: Any) -> None:
    forged = """
        class Yes:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        def f(x):
            return Yes()
    """
    rows = [
        mbpp(forged, ["assert f(1) == 2"]),
        humaneval(forged, "def check(candidate):\n    assert candidate(1) == 2\n", "f"),
    ]
    assert score_all(code_tests, rows) == [0.0, 0.0]


# ------------------------------------------------------------------ shapes: (honest, wrong twin)
IN_PLACE_CHECK = """
    def check(candidate):
        nums = [0, 1, 0, 3, 12]
        assert candidate(nums) is None
        assert nums == [1, 3, 12, 0, 0]
"""
NESTED_CHECK = """
    def check(candidate):
        first = [1, 2]
        matrix = [first, [3, 4]]
        candidate(matrix)
        assert matrix == [[3, 1], [4, 2]] and first == [3, 1]
"""
APPLY_CHECK = """
    def check(candidate):
        assert candidate(lambda v: v * 2, [1, 2]) == [2, 4]
        assert candidate(str, [1]) == ['1']
"""
TWO_SUM_CHECK = """
    def check(candidate):
        assert candidate([2, 7, 11, 15], 9) == [0, 1]
        assert candidate([3, 2, 4], 6) == [1, 2]
"""
CHAIN_ASSERTS = [
    "assert max_chain_length([Pair(5, 24), Pair(15, 25),Pair(27, 40), Pair(50, 60)], 4) == 3",
    "assert max_chain_length([Pair(1, 2), Pair(3, 4),Pair(5, 6), Pair(7, 8)], 4) == 4",
    "assert max_chain_length([Pair(19, 10), Pair(11, 12),Pair(13, 14), Pair(15, 16), Pair(31, 54)], 5) == 5",
]
TREE_SETUP = """
root = Node(1)
root.left = Node(2)
root.right = Node(3)
root.left.left = Node(4)
root.left.right = Node(5)
root1 = Node(1);
root1.left = Node(2);
root1.right = Node(3);
root1.left.left = Node(4);
root1.right.left = Node(5);
root1.right.right = Node(6);
root1.right.right.right= Node(7);
root1.right.right.right.right = Node(8)
root2 = Node(1)
root2.left = Node(2)
root2.right = Node(3)
root2.left.left = Node(4)
root2.left.right = Node(5)
root2.left.left.left = Node(6)
root2.left.left.right = Node(7)
"""
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "argument mutated in place (LeetCode moveZeroes)": (
        humaneval(
            """
            class Solution:
                def moveZeroes(self, nums):
                    kept = [x for x in nums if x != 0]
                    nums[:] = kept + [0] * (len(nums) - len(kept))
            """,
            IN_PLACE_CHECK,
            "Solution().moveZeroes",
        ),
        humaneval(
            """
            class Solution:
                def moveZeroes(self, nums):
                    nums = sorted(nums, key=lambda x: x == 0)
            """,
            IN_PLACE_CHECK,
            "Solution().moveZeroes",
        ),
    ),
    "nested argument mutated in place (rotate a matrix)": (
        humaneval(
            """
            def rotate(m):
                n = len(m)
                for i in range(n):
                    for j in range(i + 1, n):
                        m[i][j], m[j][i] = m[j][i], m[i][j]
                for row in m:
                    row.reverse()
            """,
            NESTED_CHECK,
            "rotate",
        ),
        humaneval(
            """
            def rotate(m):
                return [list(r) for r in zip(*m[::-1])]
            """,
            NESTED_CHECK,
            "rotate",
        ),
    ),
    "dict and set arguments mutated in place": (
        mbpp(
            "def tally(d, s, x):\n    d[x] = d.get(x, 0) + 1\n    s.add(x)\n",
            ["d = {}\ns = set()\ntally(d, s, 'a')\ntally(d, s, 'a')\nassert d == {'a': 2} and s == {'a'}"],
        ),
        mbpp(
            "def tally(d, s, x):\n    d = dict(d)\n    d[x] = 1\n",
            ["d = {}\ns = set()\ntally(d, s, 'a')\ntally(d, s, 'a')\nassert d == {'a': 2} and s == {'a'}"],
        ),
    ),
    "object returned and used (design problem)": (
        humaneval(
            """
            class MinStack:
                def __init__(self):
                    self.items = []
                def push(self, x):
                    self.items.append(x)
                def pop(self):
                    self.items.pop()
                def getMin(self):
                    return min(self.items)
            """,
            """
            def check(candidate):
                s = candidate()
                s.push(3)
                s.push(1)
                assert s.getMin() == 1
                s.pop()
                assert s.getMin() == 3 and len(s.items) == 1
            """,
            "MinStack",
        ),
        humaneval(
            """
            class MinStack:
                def __init__(self):
                    self.items = []
                def push(self, x):
                    self.items.append(x)
                def pop(self):
                    self.items.pop(0)
                def getMin(self):
                    return self.items[-1]
            """,
            """
            def check(candidate):
                s = candidate()
                s.push(3)
                s.push(1)
                assert s.getMin() == 1
                s.pop()
                assert s.getMin() == 3 and len(s.items) == 1
            """,
            "MinStack",
        ),
    ),
    "closure returned (factory)": (
        humaneval(
            "def adder(k):\n    return lambda x: x + k\n",
            "def check(candidate):\n    assert candidate(3)(4) == 7\n",
            "adder",
        ),
        humaneval(
            "def adder(k):\n    return lambda x: x - k\n",
            "def check(candidate):\n    assert candidate(3)(4) == 7\n",
            "adder",
        ),
    ),
    "callable passed by the tests": (
        humaneval(
            "def apply_all(fn, xs):\n    return [fn(x) for x in xs]\n",
            APPLY_CHECK,
            "apply_all",
        ),
        humaneval(
            "def apply_all(fn, xs):\n    return list(xs)\n",
            APPLY_CHECK,
            "apply_all",
        ),
    ),
    "type passed by the tests (MBPP remove_datatype)": (
        mbpp(
            "def remove_datatype(t, data_type):\n    return [x for x in t if not isinstance(x, data_type)]\n",
            ["assert remove_datatype((4, 5, 4, 7.7, 1.2), int) == [7.7, 1.2]"],
        ),
        mbpp(
            "def remove_datatype(t, data_type):\n    return [x for x in t if isinstance(x, data_type)]\n",
            ["assert remove_datatype((4, 5, 4, 7.7, 1.2), int) == [7.7, 1.2]"],
        ),
    ),
    "instances of the program's class built by the tests (MBPP max_chain_length)": (
        mbpp(
            """
            class Pair(object):
                def __init__(self, a, b):
                    self.a = a
                    self.b = b
            def max_chain_length(arr, n):
                max = 0
                mcl = [1 for i in range(n)]
                for i in range(1, n):
                    for j in range(0, i):
                        if (arr[i].a > arr[j].b and mcl[i] < mcl[j] + 1):
                            mcl[i] = mcl[j] + 1
                for i in range(n):
                    if (max < mcl[i]):
                        max = mcl[i]
                return max
            """,
            CHAIN_ASSERTS,
        ),
        mbpp(
            """
            class Pair(object):
                def __init__(self, a, b):
                    self.a = a
                    self.b = b
            def max_chain_length(arr, n):
                return n
            """,
            CHAIN_ASSERTS,
        ),
    ),
    "objects built by test_setup_code (MBPP max_height)": (
        mbpp(
            """
            class Node:
                def __init__(self, data):
                    self.data = data
                    self.left = None
                    self.right = None
            def max_height(node):
                if node is None:
                    return 0
                return max(max_height(node.left), max_height(node.right)) + 1
            """,
            ["assert (max_height(root)) == 3", "assert (max_height(root1)) == 5", "assert (max_height(root2)) == 4"],
            TREE_SETUP,
        ),
        mbpp(
            """
            class Node:
                def __init__(self, data):
                    self.data = data
                    self.left = None
                    self.right = None
            def max_height(node):
                return 3
            """,
            ["assert (max_height(root)) == 3", "assert (max_height(root1)) == 5", "assert (max_height(root2)) == 4"],
            TREE_SETUP,
        ),
    ),
    "expression entry point (LeetCode Solution().twoSum)": (
        humaneval(
            """
            class Solution:
                def twoSum(self, nums, target):
                    seen = {}
                    for i, x in enumerate(nums):
                        if target - x in seen:
                            return [seen[target - x], i]
                        seen[x] = i
            """,
            TWO_SUM_CHECK,
            "Solution().twoSum",
        ),
        humaneval(
            "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n",
            TWO_SUM_CHECK,
            "Solution().twoSum",
        ),
    ),
    "program object passed back into the program": (
        mbpp(
            "class Box:\n    def __init__(self, v):\n        self.v = v\ndef unbox(b):\n    return b.v\n",
            ["b = Box(7)\nassert unbox(b) == 7 and b == b and b != Box(7)"],
        ),
        mbpp(
            "class Box:\n    def __init__(self, v):\n        self.v = v\ndef unbox(b):\n    return None\n",
            ["b = Box(7)\nassert unbox(b) == 7 and b == b and b != Box(7)"],
        ),
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_honest_program_passes_and_its_wrong_twin_fails(code_tests: Any, shape: str) -> None:
    honest, wrong = SHAPES[shape]
    assert score_all(code_tests, [honest, wrong]) == [1.0, 0.0]


# ------------------------------------------------------------------ `python prog.py`'s argv and file
# What `python prog.py` gives a program: argv is its file's name alone (the judges' `if len(sys.argv) > 1:
# sys.stdin = open(sys.argv[1])` then leaves stdin alone), `__file__` is that file's absolute path and holds its
# source; the call-based judges import it as a module (no `__main__`). The wrong twin expects `__main__`.
WHERE = """
    import os, sys
    if len(sys.argv) > 1:  # the judges' idiom: a local run reads its input from the file it is given
        sys.stdin = open(sys.argv[1])
    {head}
    {indent}with open(__file__) as f:
    {indent}    own = "def where" in f.read()
    {indent}return [sys.argv == [os.path.basename(__file__)], os.path.isabs(__file__), own, __name__ {cmp} "__main__"]
"""
WHERE_CHECK = "def check(candidate):\n    assert candidate() == [True, True, True, True]\n"


def where(cmp: str, method: bool = False) -> str:
    head = "class Solution:\n        def where(self):" if method else "def where():"
    return textwrap.dedent(WHERE.format(head=head, indent="    " * (1 + method), cmp=cmp))


ARGV_RUNNERS: dict[str, Any] = {
    "HumanEval check(candidate)": lambda cmp: humaneval(where(cmp), WHERE_CHECK, "where"),
    "MBPP test_list": lambda cmp: mbpp(where(cmp), ["assert where() == [True, True, True, True]"]),
    "LeetCode Solution().where": lambda cmp: humaneval(where(cmp, method=True), WHERE_CHECK, "Solution().where"),
    "APPS fn_name": lambda cmp: {
        "completion": where(cmp),
        "input_output": json.dumps({"fn_name": "where", "inputs": [[]], "outputs": [[[True, True, True, True]]]}),
    },
}


@pytest.mark.parametrize("runner", sorted(ARGV_RUNNERS))
def test_every_call_runner_gives_python_prog_py_argv_and_file(code_tests: Any, runner: str) -> None:
    row = ARGV_RUNNERS[runner]
    assert score_all(code_tests, [row("!="), row("==")]) == [1.0, 0.0]


def test_a_callback_that_calls_the_program_back(code_tests: Any) -> None:
    """A call inside a call: the program calls the tests' lambda, which calls the program again."""
    program = "def apply(fn, x):\n    return x * 2 if fn is None else fn(x) + 1\n"
    check = "def check(candidate):\n    assert candidate(lambda v: candidate(None, v), 5) == 11\n"
    wrong = "def apply(fn, x):\n    return x * 2 if fn is None else fn(x) - 1\n"
    assert score_all(code_tests, [humaneval(program, check, "apply"), humaneval(wrong, check, "apply")]) == [1.0, 0.0]


def test_rewards_score_gives_every_honest_shape_1_and_every_wrong_twin_0(code_sandbox: None, tmp_path: Path) -> None:
    """The same rows through `grpo-pipeline rewards score`, as a user tries a dataset before training."""
    rows = [
        {**row, "kind": kind}
        for honest, wrong in SHAPES.values()
        for kind, row in (("honest", honest), ("wrong", wrong))
    ]
    source, out = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["rewards", "score", "--rewards", "code_tests", "--input", str(source), "--output", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["code_tests"] for r in scored] == [1.0 if r["kind"] == "honest" else 0.0 for r in scored]
