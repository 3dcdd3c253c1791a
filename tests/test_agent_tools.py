"""The built-in tools (agents/calculator.py, agents/python_tool.py): the honest case, its wrong twin, and hostile
calls (huge exponents, code that is not arithmetic, fork bombs, infinite loops, host files, floods), each contained
and answered with a message within limits, a failed call raising ToolFailure (agents/failure.py); and TRL's JSON
schema of each."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from transformers.utils import get_json_schema

from grpo_pipeline.agents import python_tool
from grpo_pipeline.agents.calculator import MAX_EXPRESSION_CHARS, calculator
from grpo_pipeline.agents.failure import ToolFailure, run_call
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
        ("9**9**9", "more than 1000 digits"),
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
    with pytest.raises(ToolFailure, match=re.escape(says)):
        calculator(expression)
    assert time.monotonic() - start < 1.0


# Each literal is refused from its text, before its value is built (building 10**100000000 exactly takes minutes);
# the honest neighbours at the edge of MAX_DIGITS still compute.
HUGE_NUMBERS = [
    ("1e100000000", "error: the number '1e100000000' has more than 1000 digits"),
    ("1E+99999999", "error: the number '1E+99999999' has more than 1000 digits"),
    ("1.5e-99999999", "error: the number '1.5e-99999999' has more than 1000 digits"),
    (".5e9999999", "error: the number '.5e9999999' has more than 1000 digits"),
    ("1_0e9999999", "error: the number '1_0e9999999' has more than 1000 digits"),
    ("1e999999999999999999999999", "error: the number '1e999999999999999999999999' has more than 1000 digits"),
    ("2 * 1e99999999", "error: the number '1e99999999' has more than 1000 digits"),
    ("0 * 1e-99999999", "error: the number '1e-99999999' has more than 1000 digits"),
    ("(1e99999999 - 1e99999999)", "error: the number '1e99999999' has more than 1000 digits"),
    ("1e1001", "error: the number '1e1001' has more than 1000 digits"),
    ("9**9**9", "error: the exponent is too large"),
    ("2 ** 10 ** 999", "error: the exponent is too large"),
    ("1e1000 / 1e1000", "1"),
    ("1e-1000 * 1e1000", "1"),
    ("0e99999999999", "0"),
    ("(-1) ** 10 ** 999", "1"),
    ("0x10 + 0o7 + 0b1", "24"),
]
# the answer comes in a child process, so that a regression fails the test instead of holding the suite
ANSWER_IN_A_CHILD = """\
import sys
from grpo_pipeline.agents.calculator import calculator
from grpo_pipeline.agents.failure import ToolFailure
try:
    print(calculator(sys.argv[1]))
except ToolFailure as e:
    print(f"error: {e}")
"""


@pytest.mark.parametrize(("expression", "starts"), HUGE_NUMBERS)
def test_calculator_bounds_every_literal_before_building_it(expression: str, starts: str) -> None:
    try:
        child = subprocess.run(
            [sys.executable, "-c", ANSWER_IN_A_CHILD, expression], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"calculator({expression!r}) did not answer within 15 s")
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith(starts), child.stdout


def test_calculator_reads_odd_arguments_as_text() -> None:
    """TRL passes whatever JSON the model wrote: a number instead of a string is read as its text."""
    assert calculator(12) == "12"  # type: ignore[arg-type]
    with pytest.raises(ToolFailure, match="None is not a number"):
        calculator(None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- python


def told(code: str) -> tuple[str, bool]:
    """What the model reads about a run of `code`, and whether the call failed (raised ToolFailure)."""
    result, failure = run_call(run_python, {"code": code, "limits": FAST})
    return (str(failure), True) if failure is not None else (result, False)


def test_python_returns_stdout() -> None:
    assert told("print(sum(range(10)))") == ("45\n", False)
    assert told("if __name__ == '__main__':\n    print('main')") == ("main\n", False)


def test_python_sees_the_argv_and_file_of_python_prog_py() -> None:
    """As under `python prog.py`: argv is the file's name alone (never the sandbox's config), `__file__` its path."""
    code = "import os, sys\nprint(sys.argv == [os.path.basename(__file__)], os.path.isabs(__file__), sys.argv[1:])"
    assert run_python(code, FAST) == "True True []\n"


def test_python_wrong_twin_and_errors_reach_the_model() -> None:
    assert told("print(sum(range(11)))") == ("55\n", False)
    out, failed = told("def f(x):\n    return 1 / x\n\nprint(f(0))")
    assert failed and "ZeroDivisionError: division by zero" in out and 'File "<python>", line 2' in out
    assert "_grpo_tool_main" not in out  # the runner's own frame is not shown
    out, failed = told("def f(:")
    assert failed and "SyntaxError" in out
    assert told("import sys; sys.exit(3)") == ("exit status 3\n", True)
    assert told("import sys; print('bye'); sys.exit(0)") == ("bye\n", False)
    assert told("x = 1") == ("(no output)", False)


def test_python_output_keeps_the_programs_write_order() -> None:
    """A traceback comes after what the program printed before it, and stderr lines where they were written."""
    out, failed = told("print('before')\nraise ValueError('late')")
    assert failed and out.startswith("before\nTraceback (most recent call last):"), out
    assert out.endswith("ValueError: late\n")
    code = "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three')\nsys.stderr.write('four\\n')"
    assert told(code) == ("one\ntwo\nthree\nfour\n", False)


def test_python_infinite_loop_is_stopped() -> None:
    start = time.monotonic()
    assert told("while True:\n    pass") == ("stopped: the time limit of 1.5 s was reached", True)
    assert time.monotonic() - start < FAST.timeout_s + 3


def test_python_fork_bomb_is_contained() -> None:
    start = time.monotonic()
    out, failed = told("import os\nwhile True:\n    os.fork()")
    assert failed and ("BlockingIOError" in out or "stopped:" in out), out
    assert len(out) <= FAST.max_chars + 100
    assert time.monotonic() - start < FAST.timeout_s + 3
    assert told("print('after')") == ("after\n", False)  # the sandbox is usable again


def test_python_flood_is_cut() -> None:
    out, failed = told("print('x' * 10_000_000)")
    assert failed and out.endswith(f"stopped: the output passed {FAST.max_output_bytes} bytes")
    assert len(out) <= FAST.max_chars + 100 and "characters cut" in out


def test_python_memory_bomb_is_contained() -> None:
    out, failed = told("x = bytearray(8 << 30)\nprint('allocated')")
    assert failed and "MemoryError" in out and "allocated" not in out


@needs_bwrap
def test_python_cannot_read_host_files() -> None:
    out, failed = told("print(open('/etc/passwd').read())")
    assert failed and "FileNotFoundError" in out and "root:" not in out
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
    out, failed = told("#" * (FAST.max_code_chars + 1))
    assert failed and out.startswith("the code is longer than")


def test_python_reports_an_unavailable_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: object) -> object:
        raise SandboxUnavailable("no bubblewrap here")

    monkeypatch.setattr(python_tool, "default_sandbox", refuse)
    assert told("print(1)") == ("the python tool cannot run code on this machine: no bubblewrap here", True)


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
