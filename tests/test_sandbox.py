"""The sandbox against hostile programs: each must score 0, leave the host unharmed and finish within timeout + 2 s.

Every program is a HumanEval-style answer for `f(x) == 2 * x`; each test also asserts that a canary file outside the
sandbox is untouched and that this test process is alive. Hostile programs run only where the sandbox contains them
(bubblewrap, or root dropping to an unprivileged uid): as a normal user without bubblewrap they would run as you,
and kill(-1) would kill your processes, so those tests skip. Tests that need real isolation (file system, network)
are skipped when bubblewrap cannot run here (CI installs it: see .ci/run). Tests that start sandboxes are marked
`integration`; the wire-format tests at the end are plain unit tests.

As root without bubblewrap, the default interpreter may be closed to other users (e.g. under /root/.pyenv), and the
sandbox then refuses to run (tests/test_sandbox_root.py): these tests then use a system Python that unprivileged
uids can run, so the rlimits-only fallback with its uid drop is what they test.
"""

from __future__ import annotations

import os
import select
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_pipeline.rewards.code import IoLimits, humaneval_job, stdio_job
from grpo_pipeline.rewards.code_formats import StdioCase
from grpo_pipeline.rewards.harness.wire import Opaque, decode, encode
from grpo_pipeline.rewards.sandbox import (
    BASE_UID,
    CodeJob,
    RunResult,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    bwrap_status,
    pool,
    unprivileged_uid_status,
)
from grpo_pipeline.rewards.sandbox import config as sandbox_config
from grpo_pipeline.rewards.sandbox.supervise import StartError

TIMEOUT_S = 2.0
PROMPT = 'def f(x):\n    """Return twice x."""\n'
TEST = textwrap.dedent(
    """
    def check(candidate):
        assert candidate(2) == 4
        assert candidate(-3) == -6
        assert candidate(5) == 10
    """
)
SECRET = "grpo-sandbox-secret-7f3a"
HAS_BWRAP = bwrap_status()[0]
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason=f"bubblewrap unavailable: {bwrap_status()[1]}")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def make_sandbox(**settings: Any) -> Sandbox:
    """A sandbox with `settings`; where it refuses to run programs as root (no bwrap, Python closed to others), one
    on a system Python that unprivileged uids can run; skip when there is none."""
    try:
        return Sandbox(SandboxConfig(**settings))
    except SandboxUnavailable as e:
        refused = e
    python = None
    if os.geteuid() == 0 and settings.get("isolation") != "bwrap":
        python = next((p for p in SYSTEM_PYTHONS if os.path.exists(p) and unprivileged_uid_status(p)[0]), None)
    if python is None:
        pytest.skip(f"the sandbox cannot run here: {refused}")
    return Sandbox(SandboxConfig(python=python, **settings))


def require_containment(sandbox: Sandbox) -> Sandbox:
    """`sandbox`, or skip: hostile programs (kill(-1), fork storms, ...) run only where they cannot reach the host."""
    if not (sandbox.isolated or sandbox.drop_uid):
        pytest.skip(
            f"no bubblewrap and not root: programs would run as this user (uid {os.geteuid()}), whose "
            "processes a hostile program could kill"
        )
    return sandbox


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return make_sandbox(timeout_s=TIMEOUT_S, memory_mb=512, max_processes=16, max_output_bytes=1 << 16)


@pytest.fixture
def contained(sandbox: Sandbox) -> Sandbox:
    return require_containment(sandbox)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "canary.txt"
    path.write_text(SECRET)
    return path


def run_program(sandbox: Sandbox, program: str, test: str = TEST) -> RunResult:
    job = humaneval_job(PROMPT, "", test, "f")
    # no wall-clock bound here: a program past TIMEOUT_S must end as "timeout", which the tests check by status
    return sandbox.run([CodeJob(program=textwrap.dedent(program), spec=job.spec)])[0]


def assert_host_unharmed(canary: Path) -> None:
    assert canary.read_text() == SECRET
    assert os.getpid() > 0  # we are still running, i.e. not killed


@pytest.mark.integration
def test_honest_program_passes(sandbox: Sandbox) -> None:
    result = run_program(sandbox, "def f(x):\n    return 2 * x\n")
    assert result.status == "ok", result
    assert result.score() == 1.0 and (result.passed, result.total) == (3, 3)


@pytest.mark.integration
def test_partial_program_gets_fraction(sandbox: Sandbox) -> None:
    result = run_program(sandbox, "def f(x):\n    return 4 if x == 2 else 1\n")
    assert result.score("pass") == 0.0
    assert result.score("fraction") == pytest.approx(1 / 3)


HOSTILE = {
    "sys_exit_at_import": "import sys\nsys.exit(0)\n",
    "sys_exit_in_call": "def f(x):\n    import sys\n    sys.exit(0)\n",
    "os_exit_at_import": "import os\nos._exit(0)\n",
    "os_exit_in_call": "def f(x):\n    import os\n    os._exit(0)\n",
    "raise_systemexit": "def f(x):\n    raise SystemExit(0)\n",
    "atexit_exit_0": """
        import atexit, os
        atexit.register(lambda: os._exit(0))
        def f(x):
            raise RuntimeError("fail, then hope atexit reports success")
        """,
    "skiptest_at_import": "import unittest\nraise unittest.SkipTest('nothing to see')\n",
    "skiptest_in_call": "import unittest\ndef f(x):\n    raise unittest.SkipTest('skip')\n",
    "eq_always_true": """
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = object.__hash__
        def f(x):
            return Anything()
        """,
    "int_subclass_eq": """
        class Int(int):
            def __eq__(self, other): return True
        def f(x):
            return Int(0)
        """,
    "redefine_check_and_assert_helpers": """
        import builtins
        def check(candidate):
            return True
        builtins.AssertionError = type("AssertionError", (Exception,), {})
        builtins.abs = lambda x: 0
        def f(x):
            return 0
        """,
    "tamper_caller_frame": """
        import sys, gc
        def f(x):
            frame = sys._getframe(1)
            while frame is not None:
                frame.f_globals["check"] = lambda c: None
                for name in ("passed", "total", "result"):
                    if name in frame.f_locals:
                        frame.f_locals[name] = 3
                frame = frame.f_back
            for obj in gc.get_objects():
                if type(obj).__name__ in ("Units", "Channel"):
                    obj.__dict__.update(passed={0, 1, 2}, total=3)
            return 0
        """,
    "forge_verdict_on_fds": """
        import os
        def f(x):
            for fd in range(3, 64):
                try:
                    os.write(fd, (7).to_bytes(4, "big") + b"started" + b"\\x00\\x00\\x00\\x02ok")
                except OSError:
                    pass
            return 0
        """,
    "infinite_loop": "def f(x):\n    while True:\n        pass\n",
    "infinite_loop_at_import": "while True:\n    pass\n",
    "sleep_past_timeout": "import time\ndef f(x):\n    time.sleep(60)\n    return 2 * x\n",
    "deep_recursion": """
        import sys
        sys.setrecursionlimit(10 ** 7)
        def f(x):
            return f(x + 1) + 1
        """,
    "fork_storm": """
        import os
        def f(x):
            for _ in range(12):  # at most 4096 processes without a limit
                try:
                    os.fork()
                except OSError:
                    pass
            return 2 * x + 1
        """,
    "memory_bomb": """
        def f(x):
            hoard = []
            while True:
                hoard.append(bytearray(64 << 20))
        """,
    "big_allocation": "def f(x):\n    return len(bytearray(1 << 40))\n",
    "gigabyte_of_stdout": """
        import sys, os
        def f(x):
            chunk = b"x" * (1 << 20)
            for _ in range(1024):
                os.write(1, chunk)
            return 2 * x
        """,
    "kill_parent": "import os\ndef f(x):\n    os.kill(os.getppid(), 9)\n    return 2 * x\n",
    "kill_process_group": "import os\ndef f(x):\n    os.killpg(0, 9)\n    return 2 * x\n",
    "kill_everything": "import os\ndef f(x):\n    os.kill(-1, 9)\n    return 2 * x\n",
    "interrupt_test_runner": """
        import os, signal, time
        def f(x):
            os.kill(os.getppid(), signal.SIGINT)  # KeyboardInterrupt there would be a broken test: None
            time.sleep(0.05)
            return 0
        """,
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_scores_zero(contained: Sandbox, canary: Path, name: str) -> None:
    result = run_program(contained, HOSTILE[name])
    assert result.score() == 0.0, result
    assert result.score("fraction") == 0.0, result
    assert not result.infra_error
    assert_host_unharmed(canary)


@pytest.mark.integration
def test_fork_storm_leaves_no_processes(contained: Sandbox) -> None:
    if not contained.drop_uid:
        pytest.skip("slot uids are only used when running as root")
    run_program(contained, HOSTILE["fork_storm"])
    time.sleep(0.2)
    leftovers = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid_line = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        uid = int(uid_line.split()[1])
        if BASE_UID <= uid < BASE_UID + contained.workers:
            leftovers.append(status.parent.name)
    assert leftovers == []


@pytest.mark.integration
def test_output_limit_is_reported(sandbox: Sandbox) -> None:
    result = run_program(sandbox, HOSTILE["gigabyte_of_stdout"])
    assert result.status == "output_limit"
    assert len(result.output) <= sandbox.config.max_output_bytes


@pytest.mark.integration
def test_timeout_is_reported(sandbox: Sandbox) -> None:
    assert run_program(sandbox, HOSTILE["sleep_past_timeout"]).status == "timeout"


@pytest.mark.integration
def test_environment_secret_is_not_visible(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_SANDBOX_SECRET", SECRET)
    program = """
        import os
        print(dict(os.environ))
        def f(x):
            return os.environ.get("GRPO_SANDBOX_SECRET")
        """
    test = f"def check(candidate):\n    assert candidate(1) == {SECRET!r}\n"
    result = run_program(sandbox, program, test)
    assert result.score() == 0.0, result
    assert SECRET not in result.output


# Reads how it was started, its environment, its own and its parents' fds (the tests' process, the server); on
# stderr: how many sources it could read and which held the harness's config or the expected output.
SNOOP = """
    import glob, os, sys
    seen = {{"argv": repr(sys.argv), "orig_argv": repr(sys.orig_argv), "environ": repr(dict(os.environ))}}
    for pid in ("self", str(os.getppid()), "1"):
        for path in [f"/proc/{{pid}}/cmdline", f"/proc/{{pid}}/environ", *glob.glob(f"/proc/{{pid}}/fd/*")]:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    seen[path] = os.read(fd, 1 << 20).decode(errors="replace")
                finally:
                    os.close(fd)
            except OSError:
                pass
    leaks = sorted(k for k, text in seen.items() if {config!r} in text or {expected!r} in text)
    print("read", len(seen), "leaks", leaks, sorted(seen), file=sys.stderr)
    print("\\n".join(text[:200] for text in seen.values()))  # its best guess at the answer
    def f(x):
        return "\\n".join(seen.values())
"""


@pytest.mark.integration
@pytest.mark.parametrize("style", ["stdio", "humaneval"])
def test_the_harness_config_and_expected_output_are_not_in_argv_cmdline_environ_or_fds(
    sandbox: Sandbox, style: str
) -> None:
    config = f"i{sandbox.config.memory_mb << 20};"  # RLIMIT_AS as the harness's config encodes it, and only there
    program = textwrap.dedent(SNOOP.format(config=config, expected=SECRET))
    if style == "stdio":
        job = stdio_job(program, [StdioCase("1\n", f"{SECRET}\n")], IoLimits())
    else:
        job = CodeJob(
            program,
            humaneval_job(PROMPT, "", f"def check(candidate):\n    assert candidate(1) == {SECRET!r}\n", "f").spec,
        )
    result = sandbox.run([job])[0]
    assert result.score() == 0.0, result
    read = result.output.split("read ")[1]
    assert int(read.split()[0]) >= 5 and read.split(" leaks ")[1].startswith("[]"), result.output


@pytest.mark.integration
@needs_bwrap
def test_host_files_are_not_visible(sandbox: Sandbox, canary: Path) -> None:
    program = f"""
        def f(x):
            with open({str(canary)!r}) as fh:
                return fh.read()
        """
    test = f"def check(candidate):\n    assert candidate(1) == {SECRET!r}\n"
    result = run_program(sandbox, program, test)
    assert result.score() == 0.0, result
    assert "FileNotFoundError" in result.detail


@pytest.mark.integration
@needs_bwrap
def test_cannot_write_or_delete_outside(sandbox: Sandbox, canary: Path, tmp_path: Path) -> None:
    outside = tmp_path / "written-by-sandbox.txt"
    program = f"""
        import os, shutil
        for action in (
            lambda: open({str(canary)!r}, "w").write("pwned"),
            lambda: os.remove({str(canary)!r}),
            lambda: shutil.rmtree({str(tmp_path)!r}),
            lambda: open({str(outside)!r}, "w").write("pwned"),
            lambda: open("/usr/grpo-sandbox-test", "w").write("pwned"),
        ):
            try:
                action()
            except OSError:
                pass
        def f(x):
            return 2 * x if os.path.exists({str(outside)!r}) else -1
        """
    result = run_program(sandbox, program)
    assert result.score() == 0.0, result
    assert not outside.exists() and not Path("/usr/grpo-sandbox-test").exists()
    assert_host_unharmed(canary)


@pytest.mark.integration
@needs_bwrap
def test_no_network(sandbox: Sandbox, canary: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        program = f"""
            import socket
            def f(x):
                try:
                    socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"hello")
                    return 2 * x
                except OSError:
                    return -1
            """
        result = run_program(sandbox, program)
        readable, _, _ = select.select([listener], [], [], 0.3)
        assert readable == [], "a connection from the sandbox reached the loopback listener"
    assert result.score() == 0.0, result
    assert_host_unharmed(canary)


@pytest.mark.integration
def test_cannot_kill_this_process(contained: Sandbox, canary: Path) -> None:
    program = f"""
        import os, signal
        def f(x):
            for pid in ({os.getpid()}, -{os.getpgrp()}):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return -1
        """
    result = run_program(contained, program)
    assert result.score() == 0.0
    assert_host_unharmed(canary)


@pytest.mark.integration
def test_runs_in_parallel_and_from_threads(sandbox: Sandbox) -> None:
    from concurrent.futures import ThreadPoolExecutor

    program = "def f(x):\n    return 2 * x\n"
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: run_program(sandbox, program), range(6)))
    assert [r.score() for r in results] == [1.0] * 6


@pytest.mark.integration
def test_broken_tests_are_infrastructure_errors(sandbox: Sandbox) -> None:
    test = "def check(candidate):\n    assert undefined_helper(candidate)\n"
    job = humaneval_job(PROMPT, "    return 2 * x\n", test, "f")
    # the check raises NameError inside its assert unit: a failed test, not an infrastructure error
    assert sandbox.run([job])[0].score() == 0.0
    broken = CodeJob(program="def f(x): return 2 * x", spec=dict(job.spec, test="this is not python"))
    result = sandbox.run([broken])[0]
    assert result.infra_error and result.score() is None


@pytest.mark.integration
def test_sandbox_that_cannot_start_scores_none(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = make_sandbox(timeout_s=1, workers=1)
    monkeypatch.setattr(sandbox_config, "HARNESS_SOURCE", "import os; os._exit(3)")  # the server dies at start
    job = humaneval_job(PROMPT, "    return 2 * x\n", TEST, "f")
    result = broken.run([job])[0]
    assert result.score() is None and result.status == "infra_error"
    assert result.detail == "sandbox did not start"
    assert broken.start_failures == pool.START_ATTEMPTS  # started again before giving up, and counted


@pytest.mark.integration
def test_a_start_that_fails_once_is_retried_and_counted(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """A sandbox that fails to start (an infrastructure failure) is started again: the program runs and is scored
    as usual, and the failure is counted and logged."""
    real, calls = pool.start_worker, []

    def flaky(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise StartError("bwrap: setting up uid map: Resource temporarily unavailable")
        return real(*args)

    monkeypatch.setattr(pool, "start_worker", flaky)
    sandbox = make_sandbox(timeout_s=TIMEOUT_S, workers=1)
    try:
        job = humaneval_job(PROMPT, "    return 2 * x\n", TEST, "f")
        wrong = humaneval_job(PROMPT, "    return 3 * x\n", TEST, "f")
        with caplog.at_level("WARNING"):
            results = sandbox.run([job, wrong])
    finally:
        sandbox.close()
    assert [r.score() for r in results] == [1.0, 0.0]  # the honest program passes, its wrong twin fails
    assert sandbox.start_failures == 1 and len(calls) == 2
    assert "sandbox worker 0 did not start (bwrap: setting up uid map" in caplog.text
    assert "attempt 2 of 3" in caplog.text


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(10**50),
        1.5,
        float("inf"),
        -0.0,
        "é\n;:",
        b"\x00\xff",
        1 + 2j,
        [1, (2, 3)],
        {1: "a", "b": [None]},
        {1, 2},
        frozenset({"x"}),
        range(1, 10, 3),
        ((),),
        {(1, 2): {3: 4.25}},
    ],
)
def test_wire_format_round_trips_builtin_values(value: object) -> None:
    decoded = decode(encode(value))
    assert decoded == value and type(decoded) is type(value)


def test_wire_format_makes_other_objects_opaque() -> None:
    class Sneaky:
        def __eq__(self, other: object) -> bool:
            return True

    decoded = decode(encode([Sneaky()]))
    assert isinstance(decoded[0], Opaque) and decoded[0] != 4
    assert list(decode(encode(iter([1, 2])))) == [1, 2]


@pytest.fixture(scope="module")
def fallback() -> Iterator[Sandbox]:
    sandbox = make_sandbox(isolation="none", timeout_s=TIMEOUT_S)
    yield sandbox
    sandbox.close()


@pytest.mark.integration
@pytest.mark.parametrize("name", ["sys_exit_in_call", "eq_always_true", "sleep_past_timeout", "tamper_caller_frame"])
def test_rlimits_only_fallback_still_scores_hostile_programs_zero(fallback: Sandbox, name: str) -> None:
    assert not fallback.isolated
    assert run_program(fallback, "def f(x):\n    return 2 * x\n").score() == 1.0
    assert run_program(fallback, HOSTILE[name]).score() == 0.0


@pytest.mark.integration
@pytest.mark.parametrize("name", ["kill_everything", "fork_storm", "kill_parent", "memory_bomb"])
def test_rlimits_only_fallback_as_root_contains_hostile_programs(fallback: Sandbox, canary: Path, name: str) -> None:
    if not fallback.drop_uid:
        pytest.skip("without bubblewrap, only root's drop to an unprivileged uid contains these programs")
    assert run_program(fallback, HOSTILE[name]).score() == 0.0
    assert run_program(fallback, "def f(x):\n    return 2 * x\n").score() == 1.0
    assert_host_unharmed(canary)


@pytest.mark.integration
def test_rlimits_only_fallback_kills_what_a_program_leaves(fallback: Sandbox) -> None:
    program = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:  # a daemon, out of the program's session and process group
                print("daemon", os.getpid(), flush=True)
                time.sleep(60)
            os._exit(0)
        time.sleep(0.1)
        def f(x):
            return 2 * x
        """
    result = run_program(fallback, program)
    assert result.score() == 1.0, result
    pid = int(result.output.split("daemon")[1].split()[0])
    assert not Path(f"/proc/{pid}").exists(), "the daemon outlived its sandbox"


# ---------------------------------------------------------------- the long-lived worker sandboxes
ATTACK_SERVER = """
    import ctypes, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in (1, os.getppid()):  # the fork server (pid 1) and the process that runs the tests
        libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
        for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        for path in ("mem", "environ", "fd/0"):
            try:
                open("/proc/%d/%s" % (pid, path), "rb").read(1)
            except OSError:
                pass
    def f(x):
        return 0
    """

LEAVE_DAEMON = """
    import os, time
    open("/tmp/left-behind", "w").write("x")
    open("left-behind", "w").write("x")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # a daemon: wait for the next program, then kill it and everything else
            time.sleep(0.3)
            while True:
                try:
                    os.kill(-1, 9)
                except OSError:
                    pass
                open("/tmp/daemon-alive", "w").write("x")
                time.sleep(0.001)
        os._exit(0)
    def f(x):
        return 0
    """

CLEAN_SLATE = """
    import os, time
    time.sleep(0.5)  # a daemon of the previous program would have struck by now
    def f(x):
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]
        mine = [os.path.basename(__file__)]  # only this program's own file, as under `python prog.py`
        return 2 * x if not os.listdir("/tmp") and os.listdir(".") == mine and not others else -1
    """


@pytest.fixture
def one_worker() -> Iterator[Sandbox]:
    sandbox = Sandbox(SandboxConfig(timeout_s=TIMEOUT_S, memory_mb=512, workers=1))
    yield sandbox
    sandbox.close()


def server_pid(sandbox: Sandbox) -> int:
    worker = sandbox._workers[0]
    assert worker is not None
    return worker.proc.pid


@pytest.mark.integration
@needs_bwrap
def test_program_cannot_kill_or_trace_the_fork_server(one_worker: Sandbox, canary: Path) -> None:
    assert run_program(one_worker, "def f(x):\n    return 2 * x\n").score() == 1.0
    before = server_pid(one_worker)
    result = run_program(one_worker, ATTACK_SERVER)
    assert result.score() == 0.0 and not result.infra_error, result
    assert run_program(one_worker, "def f(x):\n    return 2 * x\n").score() == 1.0
    assert server_pid(one_worker) == before, "the attack broke the worker's sandbox (it was restarted)"
    assert_host_unharmed(canary)


@pytest.mark.integration
@needs_bwrap
def test_leftovers_of_a_program_never_reach_the_next(one_worker: Sandbox) -> None:
    assert run_program(one_worker, LEAVE_DAEMON).score() == 0.0
    result = run_program(one_worker, CLEAN_SLATE)
    assert result.score() == 1.0, result


@pytest.mark.integration
@needs_bwrap
def test_crashed_server_gives_none_then_restarts(one_worker: Sandbox) -> None:
    import signal
    import threading

    assert run_program(one_worker, "def f(x):\n    return 2 * x\n").score() == 1.0
    victim = server_pid(one_worker)
    threading.Timer(0.3, os.killpg, (victim, signal.SIGKILL)).start()
    result = run_program(one_worker, "import time\ndef f(x):\n    time.sleep(1)\n    return 2 * x\n")
    assert result.infra_error and result.score() is None, result
    assert run_program(one_worker, "def f(x):\n    return 2 * x\n").score() == 1.0
    assert server_pid(one_worker) != victim


@pytest.mark.integration
@needs_bwrap
def test_files_a_program_locked_are_wiped(one_worker: Sandbox) -> None:
    program = """
        import os
        os.mkdir("locked")
        open("locked/file", "w").write("x")
        os.chmod("locked", 0o500)
        def f(x):
            return 2 * x
        """
    assert run_program(one_worker, program).score() == 1.0
    assert run_program(one_worker, CLEAN_SLATE).score() == 1.0


@pytest.mark.integration
@needs_bwrap
def test_worker_that_cannot_clean_up_is_restarted(one_worker: Sandbox) -> None:
    program = """
        import ctypes
        ctypes.CDLL(None).shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT: a segment outlives its creator
        def f(x):
            return 2 * x
        """
    assert run_program(one_worker, "def f(x):\n    return 2 * x\n").score() == 1.0
    before = server_pid(one_worker)
    assert run_program(one_worker, program).score() == 1.0
    clean = CLEAN_SLATE.replace("not others", "not others and open('/proc/sysvipc/shm').read().count(chr(10)) == 1")
    assert run_program(one_worker, clean).score() == 1.0
    assert server_pid(one_worker) != before
