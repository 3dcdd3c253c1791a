"""`ast.parse` that holds when other threads parse at the same time.

CPython 3.11 keeps the AST constructor's recursion depth in module-wide state, so two threads that turn source
into AST objects at once can trip its check and raise `SystemError: AST constructor recursion depth mismatch` for
valid source (reported in https://github.com/python/cpython/issues/106905; seen here on 3.11.7). It happens
here: stage keys parse the pipeline's modules in Prefect's task threads, and on 3.11 the standard library's
`traceback` parses a line of source for every frame it prints (the `^^^^` markers), from whichever thread logs an
error. Parsing is pure, so the fix is to serialise our own parses and to parse again when a foreign one got in the
way.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()
_MISMATCH = "AST constructor recursion depth mismatch"
_TRIES = 5  # a clash needs another thread mid-parse at the same moment; five in a row has not been seen


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, retried when a concurrent parse elsewhere tripped CPython's check."""
    for attempt in range(_TRIES):
        try:
            with _LOCK:
                return ast.parse(source, filename, mode)
        except SystemError as exc:
            if _MISMATCH not in str(exc) or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")
