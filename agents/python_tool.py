"""The `python` tool: runs the model's code in the code reward's sandbox (rewards/sandbox/) and returns its output.

The code is hostile input, as a completion scored by `code_tests` is, so it runs in the same sandbox, under the same
isolation option (`isolation`, rewards/sandbox/config.py: `Isolation`; rewards/sandbox/__init__.py has the whole threat
model): "auto" (the default) runs it in bubblewrap where bubblewrap works (no network, no host files but a read-only
/usr and Python, a tmpfs working directory, an unprivileged uid) and, where it does not, with rlimits only, under an
unprivileged uid when the host runs as root, or not at all where no such uid can run Python; "bwrap" requires
bubblewrap and refuses to start without it, as `code_tests` with `isolation: bwrap` does. A recipe chooses it with
`grpo.tool_params: {python: {isolation: bwrap}}` (`python_tool`). The per-program limits (rlimits on CPU, memory,
processes and file size, a wall clock, a cap on output) are set here for a tool call (`ToolLimits`): a few seconds and
a few kilobytes, since the result goes back into the model's context and the training step waits for it.

How it runs: the sandbox's "load" mode runs a program once, with its stdout and stderr on one output pipe, and counts
tests against it; here there are no tests, and the program is a small runner (`RUNNER`) that makes both streams
unbuffered (as `python -u` does), so the output holds what the program wrote in the order it wrote it (a traceback
after the lines printed before it), executes the model's code as `__main__` (so `if __name__ == "__main__":` blocks
run), prints a traceback without the runner's own frame, and exits non-zero when the model's code raised or exited
non-zero (the sandbox then reports a load error). What the model reads is that output, cut to `ToolLimits.max_chars`,
with a last line saying why the run stopped when it did not end by itself. A run that did not end well (a traceback, a
non-zero exit, a limit reached, code refused, a sandbox that cannot start or failed) is a failed call: the tool raises
`ToolFailure` with that text (agents/failure.py), which TRL's loop and the evaluation's count alike and hand the model
as `{'error': ...}`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from grpo_pipeline.agents.failure import ToolFailure
from grpo_pipeline.rewards.sandbox import (
    CodeJob,
    Isolation,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
    default_sandbox,
)

logger = logging.getLogger(__name__)

# The program the sandbox runs: the model's code (`SOURCE`, a string literal) executed as __main__. Its stdout and
# stderr share one pipe (rewards/harness/server.py: run_program), but a pipe makes Python's stdout block-buffered and
# its stderr line-buffered, so a traceback came out before the lines printed ahead of it; unbuffered streams, built
# as `python -u` builds them (Python/pylifecycle.c: create_stdio), keep the write order, child processes' included.
RUNNER = """\
def _grpo_tool_main(source):
    import io
    import sys
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=False, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, "__" + name + "__", stream)
    namespace = {"__name__": "__main__", "__file__": __file__, "__builtins__": __builtins__, "exit": exit, "quit": quit}
    failed = False
    try:
        exec(compile(source, "<python>", "exec"), namespace)
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"exit status {e.code}", file=sys.stderr)
            failed = True
    except BaseException as e:
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        failed = True
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    if failed:
        raise SystemExit(1)


_grpo_tool_main(SOURCE)
"""
# An empty test list: the harness loads (runs) the program and reports whether it loaded, nothing else.
NO_TESTS = {"kind": "asserts", "asserts": [], "total": 0, "imports": [], "under_test": []}
CODE_FAILED = "load error: SystemExit 1"  # the sandbox's detail when RUNNER exits after the code failed
STOPPED = {
    "timeout": "stopped: the time limit of {timeout:g} s was reached",
    "output_limit": "stopped: the output passed {bytes} bytes",
    "no_verdict": "stopped: the process was killed (a memory, CPU or process limit)",
}


@dataclass(frozen=True)
class ToolLimits:
    """Limits of one `python` tool call: a wall clock, memory, processes, the output read from the sandbox and the
    characters of it returned to the model."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 16
    max_output_bytes: int = 64 << 10  # read from the sandbox; more stops the program
    max_chars: int = 2000  # returned to the model (the head and the tail of a longer output)
    max_code_chars: int = 20_000  # longer code is refused unrun (the sandbox passes programs as one argument)
    isolation: Isolation = "auto"  # the code reward's option (rewards/sandbox/config.py: `Isolation`)

    def sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_output_bytes=self.max_output_bytes,
            file_size_mb=4,
            isolation=self.isolation,
        )


DEFAULT_LIMITS = ToolLimits()


def python(code: str) -> str:
    """Run a Python program and return what it prints (stdout and stderr, in the order it wrote them).

    The program runs in a sandbox for at most a few seconds, with limited memory and output; only the standard
    library is available. Print the values you need.

    Args:
        code: The complete Python source to run, e.g. "print(sum(range(10)))".

    Returns:
        The program's output (cut when long).

    Raises:
        ToolFailure: The program raised, exited non-zero or was stopped; the message is its output (the traceback)
            and a last line saying why it stopped if it did not end by itself.
    """
    return run_python(code, DEFAULT_LIMITS)


def python_tool(isolation: Isolation = "auto") -> Callable[[str], str]:
    """The `python` tool with the code reward's isolation option (`grpo.tool_params: {python: {isolation: ...}}`);
    the sandbox is built now, so "bwrap" without bubblewrap raises SandboxUnavailable before training, as
    `code_tests` does, instead of running the model's code with rlimits only (ValueError for an unknown value)."""
    limits = dataclasses.replace(DEFAULT_LIMITS, isolation=isolation)
    default_sandbox(limits.sandbox_config())

    @functools.wraps(python)  # the same name, signature and docstring: TRL's schema of the tool is unchanged
    def configured(code: str) -> str:
        return run_python(code, limits)

    return configured


def run_python(code: str, limits: ToolLimits) -> str:
    """The `python` tool under `limits`: the program's output, or ToolFailure saying why it did not end well."""
    code = str(code)
    if len(code) > limits.max_code_chars:
        raise ToolFailure(f"the code is longer than {limits.max_code_chars} characters; send a shorter program")
    job = CodeJob(program=RUNNER.replace("SOURCE", repr(code)), spec=dict(NO_TESTS))
    try:
        (result,) = default_sandbox(limits.sandbox_config()).run([job])
    except SandboxUnavailable as e:
        raise ToolFailure(f"the python tool cannot run code on this machine: {e}") from None
    except Exception as e:  # the sandbox's own failure: the model is told, training goes on
        logger.exception("python tool: the sandbox failed")
        raise ToolFailure(f"the sandbox failed ({type(e).__name__}); the code did not run") from None
    return describe(result, limits)


def describe(result: RunResult, limits: ToolLimits) -> str:
    """What the model is told about one run: its output, cut to `limits.max_chars`; raised as ToolFailure, with a
    last line saying why it stopped early where it did, when the run did not end well."""
    text = truncate(result.output, limits.max_chars)
    if result.status == "ok":
        return text if text.strip() else "(no output)"
    if result.status == "load_error" and result.detail == CODE_FAILED:  # a traceback or `exit status N` says why
        raise ToolFailure(text if text.strip() else "the program failed without output")
    if result.status == "infra_error":
        logger.error("python tool: sandbox infrastructure error: %s", result.detail)
        raise ToolFailure(f"the sandbox failed ({result.detail}); the code did not run")
    if result.status == "load_error":
        note = result.detail or "the program did not run"
    else:
        template = STOPPED.get(result.status, "stopped: " + result.status)
        note = template.format(timeout=limits.timeout_s, bytes=limits.max_output_bytes)
    raise ToolFailure(f"{text}\n{note}" if text.strip() else note)


def truncate(text: str, max_chars: int) -> str:
    """`text`, or its head and tail with a marker saying how much was left out, within `max_chars` characters."""
    if len(text) <= max_chars:
        return text
    marker = f"\n... [{len(text) - max_chars} characters cut] ...\n"
    keep = max(0, max_chars - len(marker))
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]
