"""The built-in tools (agents/calculator.py, agents/python_tool.py): the honest case, its wrong twin, and hostile
calls (huge exponents, code that is not arithmetic, fork bombs, infinite loops, host files, floods), each contained
and answered with a message within limits; and TRL's JSON schema of each."""

from __future__ import annotations

import time

import pytest
from transformers.utils import get_json_schema

from grpo_pipeline.agents import python_tool
from grpo_pipeline.agents.calculator import MAX_EXPRESSION_CHARS, calculator
from grpo_pipeline.agents.python_tool import ToolLimits, run_python, truncate
from grpo_pipeline.rewards.sandbox import SandboxUnavailable, bwrap_status

needs_bwrap = pytest.mark.skipif(not bwrap_status()[0], reason=f"bubblewrap unavailable: {bwrap_status()[1]}")
# short limits keep the hostile cases fast; the defaults are what training uses
FAST = ToolLimits(timeout_s=1.5, max_chars=500)


# ----------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("123456789 * 987654321", "121932631112635269"),
        ("0.1 + 0.2", "0.3"),  # exact, not 0.30000000000000004
        ("(12.5 + 7) * 3 // 2", "29"),
        ("7 / 4", "1.75"),
        ("-7 % 3", "2"),
        ("2 ** -3", "0.125"),
        ("1e3 + 1_000", "2000"),
        ("1 / 3", "1/3 (about 0.33333333333333333333)"),
        (" -(-(3)) ", "3"),
    ],
)
def test_calculator_is_exact(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


def test_calculator_wrong_twin_differs() -> None:
    """One digit changed in the question changes the answer: the tool computes, it does not pattern-match."""
    assert calculator("123456789 * 987654321") != calculator("123456789 * 987654322")


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("9**9**9", "digits, more than 1000"),
        ("10 ** 1001", "digits, more than 1000"),
        ("(10**600) * (10**600)", "more than 1000 digits"),
        ("2 ** 0.5", "whole-number exponents"),
        ("1 / 0", "division by zero"),
        ("2 ^ 3", "use ** for powers"),
        ("__import__('os').system('id')", "is not arithmetic"),
        ("().__class__.__base__.__subclasses__()", "is not arithmetic"),
        ("x + 1", "is not arithmetic"),
        ("1,234", "commas are not allowed"),
        ("3 +", "not an arithmetic expression"),
        ("True + 1", "is not a number"),
        ("1" * (MAX_EXPRESSION_CHARS + 1), "longer than"),
        ("-" * 1500 + "1", "more than 500"),
        ("(" * 300 + "1" + ")" * 300, "not an arithmetic expression"),
    ],
)
def test_calculator_refuses_with_a_message(expression: str, says: str) -> None:
    start = time.monotonic()
    answer = calculator(expression)
    assert answer.startswith("error:") and says in answer, answer
    assert time.monotonic() - start < 1.0


def test_calculator_never_raises_on_odd_arguments() -> None:
    """TRL passes whatever JSON the model wrote: a number instead of a string is read as its text."""
    assert calculator(12) == "12"  # type: ignore[arg-type]
    assert calculator(None).startswith("error:")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- python


def test_python_returns_stdout() -> None:
    assert run_python("print(sum(range(10)))", FAST) == "45\n"
    assert run_python("if __name__ == '__main__':\n    print('main')", FAST) == "main\n"


def test_python_sees_the_argv_and_file_of_python_prog_py() -> None:
    """As under `python prog.py`: argv is the file's name alone (never the sandbox's config), `__file__` its path."""
    code = "import os, sys\nprint(sys.argv == [os.path.basename(__file__)], os.path.isabs(__file__), sys.argv[1:])"
    assert run_python(code, FAST) == "True True []\n"


def test_python_wrong_twin_and_errors_reach_the_model() -> None:
    assert run_python("print(sum(range(11)))", FAST) == "55\n"
    out = run_python("def f(x):\n    return 1 / x\n\nprint(f(0))", FAST)
    assert "ZeroDivisionError: division by zero" in out and 'File "<python>", line 2' in out
    assert "_grpo_tool_main" not in out  # the runner's own frame is not shown
    assert "SyntaxError" in run_python("def f(:", FAST)
    assert run_python("import sys; sys.exit(3)", FAST) == "exit status 3\n"
    assert run_python("x = 1", FAST) == "(no output)"


def test_python_infinite_loop_is_stopped() -> None:
    start = time.monotonic()
    out = run_python("while True:\n    pass", FAST)
    assert out == "stopped: the time limit of 1.5 s was reached"
    assert time.monotonic() - start < FAST.timeout_s + 3


def test_python_fork_bomb_is_contained() -> None:
    start = time.monotonic()
    out = run_python("import os\nwhile True:\n    os.fork()", FAST)
    assert "BlockingIOError" in out or "stopped:" in out, out
    assert len(out) <= FAST.max_chars + 100
    assert time.monotonic() - start < FAST.timeout_s + 3
    assert run_python("print('after')", FAST) == "after\n"  # the sandbox is usable again


def test_python_flood_is_cut() -> None:
    out = run_python("print('x' * 10_000_000)", FAST)
    assert out.endswith(f"stopped: the output passed {FAST.max_output_bytes} bytes")
    assert len(out) <= FAST.max_chars + 100 and "characters cut" in out


def test_python_memory_bomb_is_contained() -> None:
    out = run_python("x = bytearray(8 << 30)\nprint('allocated')", FAST)
    assert "MemoryError" in out and "allocated" not in out


@needs_bwrap
def test_python_cannot_read_host_files() -> None:
    out = run_python("print(open('/etc/passwd').read())", FAST)
    assert "FileNotFoundError" in out and "root:" not in out
    listing = run_python("import os\nprint(sorted(os.listdir('/root')), sorted(os.listdir('/work')))", FAST)
    assert "main" not in listing and "shared" not in listing  # no checkout, no home files: only the interpreter


@needs_bwrap
def test_python_has_no_network() -> None:
    code = (
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n"
        "except OSError as e:\n    print('no network', e)"
    )
    assert "no network" in run_python(code, FAST)


def test_python_refuses_huge_code_unrun() -> None:
    assert run_python("#" * (FAST.max_code_chars + 1), FAST).startswith("error: the code is longer than")


def test_python_reports_an_unavailable_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: object) -> object:
        raise SandboxUnavailable("no bubblewrap here")

    monkeypatch.setattr(python_tool, "default_sandbox", refuse)
    assert run_python("print(1)", FAST) == "error: the python tool cannot run code on this machine: no bubblewrap here"


def test_truncate_keeps_head_and_tail() -> None:
    text = "".join(f"{i}\n" for i in range(10_000))
    cut = truncate(text, 300)
    assert len(cut) <= 300 and cut.startswith("0\n1\n") and cut.endswith("9999\n") and "characters cut" in cut


# ----------------------------------------------------------------------------- schemas (what TRL renders)


@pytest.mark.parametrize(("tool", "argument"), [(calculator, "expression"), (python_tool.python, "code")])
def test_builtin_tools_have_json_schemas(tool: object, argument: str) -> None:
    schema = get_json_schema(tool)
    function = schema["function"]
    assert function["name"] == tool.__name__  # type: ignore[attr-defined]
    assert function["parameters"]["required"] == [argument]
    assert function["parameters"]["properties"][argument]["type"] == "string"
    assert function["parameters"]["properties"][argument]["description"]
