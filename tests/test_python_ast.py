"""`python_ast.parse`: CPython's AST constructor check that a concurrent parse in another thread can trip
(cpython#106905) is parsed again; any other error stays the caller's."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from grpo_pipeline.tasks.core import python_ast

TRIPPED = SystemError("AST constructor recursion depth mismatch (before=144, after=32)")


def flaky(failures: int, error: Exception = TRIPPED) -> tuple[SimpleNamespace, list[str]]:
    calls: list[str] = []

    def parse(source: str, filename: str, mode: str) -> ast.AST:
        calls.append(source)
        if len(calls) <= failures:
            raise error
        return ast.parse(source, filename, mode)

    return SimpleNamespace(parse=parse), calls


def test_a_parse_tripped_by_another_thread_is_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = flaky(failures=2)
    monkeypatch.setattr(python_ast, "ast", fake)
    tree = python_ast.parse("x = 1 + 2", "<test>")
    assert ast.dump(tree) == ast.dump(ast.parse("x = 1 + 2"))
    assert len(calls) == 3


def test_a_check_that_keeps_tripping_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = flaky(failures=python_ast._TRIES)
    monkeypatch.setattr(python_ast, "ast", fake)
    with pytest.raises(SystemError, match="recursion depth mismatch"):
        python_ast.parse("x = 1")
    assert len(calls) == python_ast._TRIES


def test_other_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = flaky(failures=1, error=SystemError("something else"))
    monkeypatch.setattr(python_ast, "ast", fake)
    with pytest.raises(SystemError, match="something else"):
        python_ast.parse("x = 1")
    assert len(calls) == 1
    with pytest.raises(SyntaxError):
        python_ast.parse("x = = 1")


def test_modes_and_file_names_reach_the_parser() -> None:
    assert isinstance(python_ast.parse("1 + 2", mode="eval"), ast.Expression)
    with pytest.raises(SyntaxError) as caught:
        python_ast.parse("def f(:\n", "solution.py")
    assert caught.value.filename == "solution.py"
