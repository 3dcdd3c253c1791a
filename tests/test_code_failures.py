"""A program can never turn its own failure into "unscored" (None): whatever it raises is a failed test.

None means the sandbox itself failed (or the tests are broken before they ran); every exception that comes out of
the program's objects while the tests run them, however odd (BaseException subclasses, SystemExit or
KeyboardInterrupt in a called function, exceptions whose __str__ or __repr__ raise, values that raise while they
are sent, an object in place of the function under test), scores 0. Each program is tried in every test style:
HumanEval `check`, a LeetCode-style entry expression, MBPP asserts (one whose message prints the answer), APPS
call-based cases and stdin/stdout cases. Each style's honest program scores 1.0 beside them.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from grpo_pipeline.rewards.registry import build_reward
from grpo_pipeline.rewards.sandbox import CodeJob, Sandbox, SandboxConfig

pytestmark = pytest.mark.integration

# Each defines `f` (the function under test: f(x) == 2 * x) so that calling it, sending what it returns, or even
# looking it up raises something unusual in the program's process.
RAISERS = {
    "a BaseException subclass": "class Boom(BaseException):\n    pass\ndef f(x):\n    raise Boom('no')\n",
    "SystemExit in the call": "import sys\ndef f(x):\n    sys.exit(0)\n",
    "KeyboardInterrupt in the call": "def f(x):\n    raise KeyboardInterrupt\n",
    "GeneratorExit in the call": "def f(x):\n    raise GeneratorExit\n",
    "StopIteration in the call": "def f(x):\n    raise StopIteration\n",
    "an exception whose __str__ raises": """
        class Odd(Exception):
            def __str__(self):
                raise Odd()
            __repr__ = __str__
        def f(x):
            raise Odd()
    """,
    "an exception whose __str__ raises SystemExit": """
        class Odd(Exception):
            def __str__(self):
                raise SystemExit(0)
        def f(x):
            raise Odd()
    """,
    "an exception named like one that needs more arguments": """
        class UnicodeDecodeError(Exception):
            pass
        def f(x):
            raise UnicodeDecodeError('one argument')
    """,
    "an exception class whose name raises": """
        class Meta(type):
            @property
            def __name__(cls):
                raise SystemExit(0)
        class Odd(Exception, metaclass=Meta):
            pass
        def f(x):
            raise Odd()
    """,
    "an answer whose __str__ and __repr__ raise": """
        class Answer:
            def __str__(self):
                raise ValueError('unprintable')
            __repr__ = __str__
        def f(x):
            return Answer()
    """,
    "an answer that raises while it is sent": """
        class Sending:
            def __iter__(self):
                return self
            def __next__(self):
                raise ValueError('cannot send')
        def f(x):
            return Sending()
    """,
    "f is an iterator that raises when sent": "f = (1 / 0 for _ in [0])\n",
    "f raises SystemExit when sent": """
        class Exiting:
            def __iter__(self):
                return self
            def __next__(self):
                raise SystemExit(0)
        f = Exiting()
    """,
    "a signalling NaN": "from decimal import Decimal\ndef f(x):\n    return Decimal('sNaN')\n",
}
HONEST = "def f(x):\n    return 2 * x\n"

CHECK = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n"
ASSERTS = ["assert f(2) == 4, f(2)", "assert f(-3) == -6"]  # the message shows the answer, as some rows do
CALLS = json.dumps({"inputs": [[2], [-3]], "outputs": [[4], [-6]], "fn_name": "f"})


def as_class(program: str) -> str:
    """The program as a LeetCode `Solution` whose construction (and method) runs the program's `f`."""
    init = "    def __init__(self):\n        self.g = f\n        self.g(0)\n"
    return program + "\nclass Solution:\n" + init + "    def f(self, x):\n        return self.g(x)\n"


STYLES: dict[str, tuple[dict[str, Any], Any]] = {  # style: (row columns, how a program becomes the completion)
    "HumanEval check": ({"prompt": "", "test": CHECK, "entry_point": "f"}, lambda p: p),
    "LeetCode entry expression": ({"prompt": "", "test": CHECK, "entry_point": "Solution().f"}, as_class),
    "MBPP asserts": ({"test_list": ASSERTS}, lambda p: p),
    "APPS call-based": ({"input_output": CALLS}, lambda p: p),
}


@pytest.fixture(scope="module")
def code_tests(code_sandbox: None) -> Any:
    return build_reward("code_tests", {"timeout_s": 20.0})


@pytest.mark.parametrize("style", sorted(STYLES))
def test_whatever_a_program_raises_scores_zero_never_none(code_tests: Any, style: str) -> None:
    columns, completion = STYLES[style]
    names = sorted(RAISERS)
    programs = [completion(HONEST), *(completion(textwrap.dedent(RAISERS[n])) for n in names)]
    n = len(programs)
    scores = code_tests([columns.get("prompt", "")] * n, programs, **{k: [v] * n for k, v in columns.items()})
    assert dict(zip(["honest", *names], scores, strict=True)) == {"honest": 1.0, **dict.fromkeys(names, 0.0)}


STDIO_RAISERS = {
    "a BaseException subclass": "class Boom(BaseException):\n    pass\nraise Boom()\n",
    "KeyboardInterrupt": "print(3)\nraise KeyboardInterrupt\n",
    "an exception whose __str__ raises SystemExit": """
        class Odd(Exception):
            def __str__(self):
                raise SystemExit(0)
        print(3)
        raise Odd()
    """,
    "a closed stdout": "import sys\nsys.stdout.close()\n",
    "bytes that are not UTF-8": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe3\\n')\n",
}


def test_stdin_programs_that_raise_score_zero_never_none(code_tests: Any) -> None:
    columns = {"input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})}
    names = sorted(STDIO_RAISERS)
    programs = ["print(sum(map(int, input().split())))\n", *(textwrap.dedent(STDIO_RAISERS[n]) for n in names)]
    scores = code_tests(["Add."] * len(programs), programs, **{k: [v] * len(programs) for k, v in columns.items()})
    assert dict(zip(["honest", *names], scores, strict=True)) == {"honest": 1.0, **dict.fromkeys(names, 0.0)}


def test_only_broken_tests_or_the_sandbox_score_none(code_sandbox: None) -> None:
    """The other side of the line: tests that cannot be set up are still unscored, whatever the program."""
    sandbox = Sandbox(SandboxConfig(timeout_s=10.0, workers=1))
    try:
        broken = [
            {"kind": "humaneval", "setup": "", "test": "this is not python", "entry_point": "f", "total": 1},
            {"kind": "asserts", "asserts": ["assert f(2) == (4"], "total": 1},
            {"kind": "stdio", "cases": [("1", "2")], "total": 1, "case_timeout": 1.0, "max_output": 1000,
             "stdout_rule": "no-such-rule"},
        ]  # fmt: skip
        results = sandbox.run([CodeJob(program=HONEST, spec=spec) for spec in broken])
        assert [r.score() for r in results] == [None, None, None]
    finally:
        sandbox.close()
