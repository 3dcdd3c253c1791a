"""stdin/stdout programs score as under `python prog.py`: its argv and file, and the interpreter's shutdown runs
before stdout is read.

Python waits for a program's non-daemon threads, then runs its atexit handlers, then flushes stdout (Py_FinalizeEx).
Competitive programs rely on it: `threading.stack_size(...); sys.setrecursionlimit(...); Thread(target=main).start()`
is the usual way to recurse deeply, and some print their answer from an atexit handler. Many also start with the
judges' `if len(sys.argv) > 1: sys.stdin = open(sys.argv[1])`, which needs `python prog.py`'s argv. Each is checked
with its honest program (1.0), its wrong twin (0.0) and attempts to cheat (0.0), and the threaded ones again while
busy processes hold every core: the verdict must not depend on the machine's load.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_pipeline.rewards.registry import build_reward

pytestmark = pytest.mark.integration

ADD = {"input_output": json.dumps({"inputs": ["1 2\n", "3 4\n", "-5 5\n"], "outputs": ["3\n", "7\n", "0\n"]})}

THREADED = """
    import sys, threading
    def main():
        import time
        time.sleep(0.05)  # the main module has long returned by now
        a, b = map(int, sys.stdin.readline().split())
        print(a {op} b)
    threading.stack_size(1 << 26)
    sys.setrecursionlimit(10 ** 6)
    threading.Thread(target=main).start()
"""
DEEP_THREADED = """
    import sys, threading
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)
    def main():
        a, b = map(int, input().split())
        print(a {op} b + depth(20000) - 20000)
    threading.stack_size(1 << 26)
    sys.setrecursionlimit(10 ** 6)
    threading.Thread(target=main).start()
"""
AT_EXIT = """
    import atexit
    a, b = map(int, input().split())
    atexit.register(print, a {op} b)
"""
AT_EXIT_AFTER_SYS_EXIT = """
    import atexit, sys
    a, b = map(int, input().split())
    atexit.register(lambda: print(a {op} b))
    sys.exit(0)
"""
ARGV_FILE_IDIOM = """
    import sys
    if len(sys.argv) > 1:  # run by hand as `python prog.py input.txt`; a judge runs `python prog.py`
        sys.stdin = open(sys.argv[1])
    a, b = map(int, sys.stdin.readline().split())
    print(a {op} b)
"""
SHAPES = {"threaded": THREADED, "deep recursion in a thread": DEEP_THREADED, "atexit": AT_EXIT,
          "atexit after sys.exit": AT_EXIT_AFTER_SYS_EXIT, "input file from argv": ARGV_FILE_IDIOM}  # fmt: skip
# What a program sees of how it was started, printed before its answer: the expected output is what the same
# program prints when run for real as `python prog.py` (in another directory, so only relative facts are printed)
SEES_ITS_START = """
    import os, sys
    print({argv}, sys.orig_argv[1:], __name__, os.path.basename(__file__), os.path.isabs(__file__))
    print(os.path.dirname(__file__) == sys.path[0] == os.getcwd(), len(open(__file__).read()))
    a, b = map(int, input().split())
    print(a + b)
"""

CHEATS = {  # each would print nothing right, and tries to pass anyway
    "a daemon thread prints after exit": """
        import threading, time
        def late():
            time.sleep(0.2)
            print(3)
        threading.Thread(target=late, daemon=True).start()
    """,
    "a thread that never ends": "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n",
    "crash, then exit 0 from atexit": "import atexit, os\natexit.register(os._exit, 0)\nraise ValueError('wrong')\n",
    "an atexit handler that raises": "import atexit\natexit.register(lambda: 1 / 0)\nprint(-1)\n",
}


@pytest.fixture(scope="module")
def code_tests(code_sandbox: None) -> Any:
    return build_reward("code_tests", {"timeout_s": 20.0, "case_timeout_s": 3.0})


def score(reward: Any, programs: list[str]) -> list[float | None]:
    n = len(programs)
    return reward(["Add them."] * n, [textwrap.dedent(p) for p in programs], **{k: [v] * n for k, v in ADD.items()})


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_honest_program_passes_and_its_wrong_twin_fails(code_tests: Any, shape: str) -> None:
    program = SHAPES[shape]
    assert score(code_tests, [program.format(op="+"), program.format(op="*")]) == [1.0, 0.0]


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheats_score_zero(code_tests: Any, name: str) -> None:
    assert score(code_tests, [CHEATS[name]]) == [0.0]


def test_a_program_sees_the_argv_and_file_python_prog_py_gives_it(code_tests: Any, tmp_path: Path) -> None:
    """Scored against what the same program prints when run for real as `python prog.py`; its wrong twin prints
    another argv."""
    program, twin = (textwrap.dedent(SEES_ITS_START.format(argv=argv)) for argv in ("sys.argv", "sys.argv[:0]"))
    (tmp_path / "prog.py").write_text(program)
    inputs = json.loads(ADD["input_output"])["inputs"]
    run = functools.partial(subprocess.run, [sys.executable, "prog.py"], capture_output=True, text=True, check=True)
    outputs = [run(input=text, cwd=tmp_path).stdout for text in inputs]
    assert outputs[0] == f"['prog.py'] ['prog.py'] __main__ prog.py True\nTrue {len(program)}\n3\n", outputs[0]
    row = json.dumps({"inputs": inputs, "outputs": outputs})
    assert code_tests(["Print them."] * 2, [program, twin], input_output=[row] * 2) == [1.0, 0.0]


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """Two busy processes per core for the length of a test (ended by pid afterwards)."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_threaded_verdicts_do_not_depend_on_load(code_tests: Any, busy_cores: None) -> None:
    programs = [textwrap.dedent(shape.format(op=op)) for shape in (THREADED, DEEP_THREADED) for op in ("+", "*")] * 4
    programs = [p + f"# copy {i}\n" for i, p in enumerate(programs)]  # distinct programs: each one runs
    assert score(code_tests, programs) == [1.0, 0.0, 1.0, 0.0] * 4
