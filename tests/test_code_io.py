"""stdin/stdout and call-based code tests, in the formats public code-RL datasets publish, through `code_tests`.

Each format gets an honest program (1.0), its wrong twin (0.0) and attempts to cheat (0.0). The rows are shaped as
the datasets publish them (rewards/code_formats.py cites each); programs run in real sandboxes.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import tempfile
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.rewards.registry import build_reward
from grpo_pipeline.rewards.sandbox import SandboxConfig
from grpo_pipeline.rewards.sandbox.config import SANDBOX_TMPFS

pytestmark = pytest.mark.integration

ADD_STDIO = {"inputs": ["1 2\n", "3 4\n", "-5 5\n"], "outputs": ["3\n", "7\n", "0\n"]}
ADD_CALLS = {"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"}
HONEST_ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
WRONG_ADD = "a, b = map(int, input().split())\nprint(a * b)\n"


def lcb_private(cases: list[dict[str, str]]) -> str:
    """LiveCodeBench's private cases: base64 of zlib of a pickled JSON string."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_STDIN = {
    "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
    "private_test_cases": lcb_private([{"input": "10 20\n", "output": "30\n", "testtype": "stdin"}]),
    "metadata": json.dumps({}),
}
LCB_FUNCTIONAL = {
    "public_test_cases": json.dumps([{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
    "private_test_cases": lcb_private([{"input": "[3,2,4]\n6", "output": "[1, 2]", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "twoSum"}),
}
TWO_SUM = """
    class Solution:
        def twoSum(self, nums: list[int], target: int) -> list[int]:
            seen = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return [seen[target - x], i]
                seen[x] = i
"""
CODECONTESTS = {
    "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
    "private_tests": {"input": ["2 2\n"], "output": ["4\n"]},  # a program that multiplies passes the public test
    "generated_tests": {"input": ["7 8\n"], "output": ["15\n"]},
}
OPEN_R1 = {
    "verification_info": json.dumps(
        {
            "language": "python",
            "test_cases": [
                {"input": "1 2\n", "output": "3\n", "type": "stdin_stdout"},
                {"input": "2 2\n", "output": "4\n", "type": "stdin_stdout"},
            ],
        }
    )
}

# (row columns, honest program, wrong twin): the wrong twin multiplies where it should add, and passes a 2 2 case
FORMATS: dict[str, tuple[dict[str, Any], str, str]] = {
    "APPS stdin/stdout": ({"input_output": json.dumps(ADD_STDIO)}, HONEST_ADD, WRONG_ADD),
    "APPS call-based": (
        {"input_output": json.dumps(ADD_CALLS)},
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a * b\n",
    ),
    "APPS call-based on class Solution": (
        {"input_output": json.dumps(ADD_CALLS)},
        "class Solution:\n    def add(self, a, b):\n        return a + b\n",
        "class Solution:\n    def add(self, a, b):\n        return a * b\n",
    ),
    "CodeContests": (CODECONTESTS, HONEST_ADD, WRONG_ADD),
    "LiveCodeBench stdin": (LCB_STDIN, HONEST_ADD, WRONG_ADD),
    "LiveCodeBench functional": (
        LCB_FUNCTIONAL,
        TWO_SUM,
        "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n",
    ),
    "open-r1 verification_info": (OPEN_R1, HONEST_ADD, WRONG_ADD),
}

CHEATS = {  # stdin/stdout programs that try to pass without adding
    "kill the process that runs it": "import os\nos.kill(os.getppid(), 9)\n",
    "exit before printing": "import os\nos._exit(0)\n",
    "flood stdout": "print('3\\n' * 10_000_000)\n",
    "read the expected output from memory": (
        "import gc\nprint(next(o for o in gc.get_objects() if isinstance(o, str) and o.strip() in ('3', '7', '0')))\n"
    ),
    "write to other descriptors": "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'3\\n')\n"
    "    except OSError:\n        pass\n",
    "read another process's memory": "import os\nprint(open(f'/proc/{os.getppid()}/mem', 'rb').read(1))\n",
}


@pytest.fixture(scope="module")
def code_tests(code_sandbox: None) -> Any:
    return build_reward("code_tests", {"timeout_s": 20.0, "case_timeout_s": 5.0})


def score(reward: Any, columns: dict[str, Any], programs: list[str], prompt: str = "Solve it.") -> list[float | None]:
    n = len(programs)
    fenced = [f"Here it is:\n```python\n{textwrap.dedent(p)}```\n" for p in programs]  # a chat completion's block
    return reward([prompt] * n, fenced, **{k: [v] * n for k, v in columns.items()})


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_honest_program_passes_and_its_wrong_twin_fails(code_tests: Any, name: str) -> None:
    columns, honest, wrong = FORMATS[name]
    assert score(code_tests, columns, [honest, wrong]) == [1.0, 0.0]


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheats_score_zero(code_tests: Any, name: str) -> None:
    assert score(code_tests, {"input_output": json.dumps(ADD_STDIO)}, [CHEATS[name]]) == [0.0]


def test_an_answer_that_equals_everything_fails_call_based_tests(code_tests: Any) -> None:
    forged = "class Yes:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Yes()\n"
    killer = "import os\ndef add(a, b):\n    os.kill(os.getppid(), 9)\n"
    assert score(code_tests, {"input_output": json.dumps(ADD_CALLS)}, [forged, killer]) == [0.0, 0.0]


def test_apps_outputs_compare_as_apps_checker_does(code_tests: Any) -> None:
    """APPS's checker trims the whole output (a leading space passes there, and so here); other lines do not."""
    spaced = "a, b = map(int, input().split())\nprint(a + b, end='   \\n\\n\\n')\n"
    leading = "a, b = map(int, input().split())\nprint(' ', a + b)\n"
    two_lines = "a, b = map(int, input().split())\nprint(a)\nprint(b)\n"
    assert score(code_tests, {"input_output": json.dumps(ADD_STDIO)}, [spaced, leading, two_lines]) == [1.0, 1.0, 0.0]


def test_float_tolerance_is_opt_in(code_sandbox: None) -> None:
    """LiveCodeBench's checker compares numbers exactly (as Decimals); `float_tolerance` adds a tolerance to any
    format's rule. (APPS's own checker would pass this program: its `np.allclose` allows 1e-5.)"""
    case = [{"input": "1\n", "output": "0.3333333\n", "testtype": "stdin"}]
    columns = {"public_test_cases": json.dumps(case), "private_test_cases": lcb_private(case)}
    program = "print(int(input()) / 3)\n"  # 0.3333333333333333
    strict = build_reward("code_tests", {"timeout_s": 20.0})
    tolerant = build_reward("code_tests", {"timeout_s": 20.0, "float_tolerance": 1e-6})
    assert score(strict, columns, [program]) == [0.0]
    assert score(tolerant, columns, [program, "print(0.34)\n"]) == [1.0, 0.0]


def test_a_case_over_its_time_limit_fails_alone(code_sandbox: None) -> None:
    """Each case runs in a fresh process with its own wall clock: one that loops fails, the others still pass."""
    reward = build_reward("code_tests", {"timeout_s": 30.0, "case_timeout_s": 1.0, "mode": "fraction"})
    looping = "a, b = map(int, input().split())\nwhile a == 3:\n    pass\nprint(a + b)\n"
    hungry = "a, b = map(int, input().split())\nx = bytearray(2 << 30) if a == 3 else b''\nprint(a + b)\n"
    scores = score(reward, {"input_output": json.dumps(ADD_STDIO)}, [looping, hungry])
    assert scores == [pytest.approx(2 / 3), pytest.approx(2 / 3)]


def test_rows_that_cannot_be_scored_say_why(code_tests: Any) -> None:
    other_language = {
        "verification_info": json.dumps({"language": "cpp", "test_cases": [{"input": "1", "output": "1"}]})
    }
    assert score(code_tests, other_language, [HONEST_ADD]) == [None]
    assert "cpp" in code_tests.none_reasons[0]


def test_rewards_score_gives_honest_rows_1_and_wrong_twins_0(code_sandbox: None, tmp_path: Path) -> None:
    rows = []
    for name, (columns, honest, wrong) in FORMATS.items():
        for kind, program in (("honest", honest), ("wrong", wrong)):
            rows.append({"prompt": name, "completion": textwrap.dedent(program), "kind": kind, **columns})
    source, out = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        app, ["rewards", "score", "--rewards", "code_tests", "--input", str(source), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["code_tests"] for r in scored] == [1.0 if r["kind"] == "honest" else 0.0 for r in scored]


def open_r1_call(argument: str, output: str) -> str:
    """A `verification_info` with one function_call case: `argument` a Python literal (open-r1's rows hold sets,
    bytes and tuples so)."""
    case = {"type": "function_call", "fn_name": "f", "input": f"[{argument}]", "output": output}
    return json.dumps({"language": "python", "test_cases": [case]})


def test_function_call_inputs_json_cannot_hold_score_row_by_row(code_tests: Any) -> None:
    """Sets and bytes in a case's input (JSON cannot hold them) are scored like any row, beside other rows; and
    rows that differ only as a tuple and a list are never given one verdict for both."""
    rows = [
        (open_r1_call("{1, 2, 3}", "6"), "def f(x):\n    return sum(x)\n", 1.0),
        (open_r1_call("{1, 2, 3}", "6"), "def f(x):\n    return len(x)\n", 0.0),
        (open_r1_call("b'abcd'", "4"), "def f(x):\n    return len(x)\n", 1.0),
        (open_r1_call("(1, 2)", "true"), "def f(x):\n    return type(x) is tuple\n", 1.0),
        (open_r1_call("[1, 2]", "true"), "def f(x):\n    return type(x) is tuple\n", 0.0),
        (open_r1_call("[1, 2]", "3"), "def f(x):\n    return sum(x)\n", 1.0),
    ]
    info, programs, expected = zip(*rows, strict=True)
    assert code_tests(["Solve it."] * len(rows), list(programs), verification_info=list(info)) == list(expected)


def test_job_keys_tell_apart_what_the_sandbox_tells_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_pipeline.rewards import code

    calls = {"kind": "calls", "entry_point": "f", "total": 1}
    assert code.job_key({**calls, "calls": [([(1, 2)], True)]}) != code.job_key({**calls, "calls": [([[1, 2]], True)]})
    assert code.job_key({**calls, "calls": [([{1, 2}], 3)]}) == code.job_key({**calls, "calls": [([{2, 1}], 3)]})
    assert code.job_key({**calls, "calls": [([b"ab"], 2)]}) != code.job_key({**calls, "calls": [(["ab"], 2)]})

    def refuse(value: object) -> str:
        raise TypeError("cannot encode")

    monkeypatch.setattr(code.wire, "encode", refuse)
    assert code.job_key(calls) != code.job_key(calls)  # no key: each row runs on its own


def test_extra_ro_paths_make_a_package_importable(code_sandbox: None) -> None:
    """The harness runs with `-I -S`: a directory in `extra_ro_paths` is put on the program's sys.path, so a
    package there imports (a copy of this environment's `packaging`); without the setting the import fails."""
    import packaging

    columns = {"input_output": json.dumps({"inputs": ["1.10\n"], "outputs": ["10\n"]})}
    program = "from packaging.version import Version\nprint(Version(input()).minor)\n"
    site = tempfile.mkdtemp(prefix="grpo-extra-ro-", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None)
    try:
        if site.startswith(SANDBOX_TMPFS):
            pytest.skip(f"no writable directory outside {SANDBOX_TMPFS} for the package")
        os.chmod(site, 0o755)  # the sandbox's unprivileged uid reads it
        shutil.copytree(Path(packaging.__file__).parent, Path(site) / "packaging")
        plain = build_reward("code_tests", {"timeout_s": 20.0})
        with_site = build_reward("code_tests", {"timeout_s": 20.0, "extra_ro_paths": [site]})
        assert score(plain, columns, [program]) == [0.0]
        assert score(with_site, columns, [program, "print(9)\n"]) == [1.0, 0.0]
    finally:
        shutil.rmtree(site, ignore_errors=True)


def test_extra_ro_paths_the_sandbox_would_hide_are_refused() -> None:
    for hidden in ("/tmp/site-packages", "/work"):
        with pytest.raises(ValueError, match="would be hidden"):
            SandboxConfig(extra_ro_paths=(hidden,))
