"""Assert lists (MBPP) whose function under test is named like a builtin: which calls are the program's.

The harness never lets a program's definition stand in for a builtin that an assert uses: a wrong program that
defines `sorted` (or `set`, `len`) could otherwise make `assert sorted(f(x)) == sorted([3, 1])` hold, since the
assert applies the builtin to the expected value too. But some public rows test a function that is itself named
like a builtin: MBPP task 126 is `def sum(a, b)` (the sum of common divisors), tested as `assert sum(10, 15) == 6`.
There the call is the program's, as in the authors' run.

The rule: the expected side of an assert is computed as the dataset's authors ran it, with the real builtins; the
program's names count only where the assert calls the function under test. That function is the row's
`entry_point` when it has one; otherwise, when every name the asserts call is a builtin (none is the program's own
function, which would be the one under test), it is the innermost builtin-named call on the tested side (the left
of `==`, or the whole assert when it compares nothing), preferring names the expected side does not use: the
function under test takes the test's inputs, and the builtins around it post-process its answer. Only those calls
are renamed (to `UNDER_TEST + name`), and the harness binds that name to the program's definition, or to the
builtin when the program defines none.
"""

from __future__ import annotations

import ast
import builtins
import functools

from grpo_pipeline.tasks.core import python_ast

UNDER_TEST = "_grpo_under_test_"  # the harness binds UNDER_TEST + name to the program's `name`


def _is_builtin(name: str) -> bool:
    return hasattr(builtins, name)


def _sides(statement: str) -> list[tuple[ast.expr, list[ast.expr]]]:
    """(tested side, expected side) of every assert in `statement`: `left` and the comparators of a comparison,
    else the whole test and nothing."""
    sides: list[tuple[ast.expr, list[ast.expr]]] = []
    for node in ast.walk(python_ast.parse(statement)):
        if isinstance(node, ast.Assert):
            test = node.test
            sides.append((test.left, list(test.comparators)) if isinstance(test, ast.Compare) else (test, []))
    return sides


def _name_calls(node: ast.AST) -> list[tuple[str, ast.Call]]:
    """(name, call) of every call of a bare name (`f(x)`, not `math.f(x)`) in `node`, outermost first."""
    return [(n.func.id, n) for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]


def _innermost(calls: list[tuple[str, ast.Call]]) -> set[str]:
    """Names of the calls in `calls` that contain none of the others in their arguments."""
    ids = {id(call) for _, call in calls}
    return {
        name
        for name, call in calls
        if not any(id(n) in ids for arg in (*call.args, *call.keywords) for n in ast.walk(arg))
    }


@functools.lru_cache(maxsize=4096)
def builtins_under_test(statements: tuple[str, ...], entry_point: str | None = None) -> tuple[str, ...]:
    """Builtin names that `statements` call as the function under test (see the module docstring); () when the
    function under test is named like no builtin."""
    if entry_point:
        return (entry_point,) if entry_point.isidentifier() and _is_builtin(entry_point) else ()
    sides = [side for s in statements for side in _sides(s)]
    called = {name for tested, expected in sides for n in (tested, *expected) for name, _ in _name_calls(n)}
    if not called or any(not _is_builtin(name) for name in called):
        return ()
    found: set[str] = set()
    for tested, expected in sides:
        on_expected = {name for n in expected for name, _ in _name_calls(n)}
        calls = _name_calls(tested)
        found |= _innermost([(name, c) for name, c in calls if name not in on_expected] or calls)
    return tuple(sorted(found))


def mark_under_test(statement: str, names: tuple[str, ...]) -> str:
    """`statement` with its tested side's calls of `names` renamed to `UNDER_TEST + name` (unchanged without any)."""
    tree = python_ast.parse(statement)
    changed = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            tested = node.test.left if isinstance(node.test, ast.Compare) else node.test
            for name, call in _name_calls(tested):
                if name in names:
                    call.func = ast.Name(UNDER_TEST + name, ast.Load())
                    changed = True
    return ast.unparse(ast.fix_missing_locations(tree)) if changed else statement
