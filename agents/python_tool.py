"""The `python` tool: runs the model's code in the code reward's sandbox (rewards/sandbox/) and returns its output.

The code is hostile input, as a completion scored by `code_tests` is, so it gets the same isolation (bubblewrap:
no network, no host files but a read-only /usr and Python, a tmpfs working directory, an unprivileged uid;
rewards/sandbox/__init__.py has the whole threat model) and the same per-program limits (rlimits on CPU, memory,
processes and file size, a wall clock, a cap on output), set here for a tool call (`ToolLimits`): a few seconds and
a few kilobytes, since the result goes back into the model's context and the training step waits for it.

How it runs: the sandbox's "load" mode runs a program once, with its stdout and stderr on the run's output pipe,
and counts tests against it; here there are no tests, and the program is a small runner (`RUNNER`) that executes the
model's code as `__main__` (so `if __name__ == "__main__":` blocks run), prints a traceback without the runner's own
frame, and flushes both streams before the sandbox stops it. What the tool returns is that output, cut to
`ToolLimits.max_chars`, with a last line saying why the run stopped when it did not end by itself. The tool never
raises: a sandbox that cannot start is a returned error message too (and logged once, loudly, by the sandbox).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from grpo_pipeline.rewards.sandbox import CodeJob, RunResult, SandboxConfig, SandboxUnavailable, default_sandbox

logger = logging.getLogger(__name__)

# The program the sandbox runs: the model's code (`SOURCE`, a string literal) executed as __main__.
RUNNER = """\
def _grpo_tool_main(source):
    import sys
    namespace = {"__name__": "__main__", "__file__": __file__, "__builtins__": __builtins__, "exit": exit, "quit": quit}
    try:
        exec(compile(source, "<python>", "exec"), namespace)
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"exit status {e.code}", file=sys.stderr)
    except BaseException as e:
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass


_grpo_tool_main(SOURCE)
"""
# An empty test list: the harness loads (runs) the program and reports whether it loaded, nothing else.
NO_TESTS = {"kind": "asserts", "asserts": [], "total": 0, "imports": [], "under_test": []}
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

    def sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_output_bytes=self.max_output_bytes,
            file_size_mb=4,
        )


DEFAULT_LIMITS = ToolLimits()


def python(code: str) -> str:
    """Run a Python program and return what it prints (stdout and stderr).

    The program runs in an isolated sandbox with no network and no access to files outside it, for at most a few
    seconds; only the standard library is available. Print the values you need.

    Args:
        code: The complete Python source to run, e.g. "print(sum(range(10)))".

    Returns:
        The program's output (cut when long), and a last line saying why it stopped if it did not end by itself.
    """
    return run_python(code, DEFAULT_LIMITS)


def run_python(code: str, limits: ToolLimits) -> str:
    """The `python` tool under `limits`; never raises (a failure of the sandbox itself is a message too)."""
    code = str(code)
    if len(code) > limits.max_code_chars:
        return f"error: the code is longer than {limits.max_code_chars} characters; send a shorter program"
    job = CodeJob(program=RUNNER.replace("SOURCE", repr(code)), spec=dict(NO_TESTS))
    try:
        (result,) = default_sandbox(limits.sandbox_config()).run([job])
    except SandboxUnavailable as e:
        return f"error: the python tool cannot run code on this machine: {e}"
    except Exception as e:  # the sandbox's own failure: the model is told, training goes on
        logger.exception("python tool: the sandbox failed")
        return f"error: the sandbox failed ({type(e).__name__}); the code did not run"
    return describe(result, limits)


def describe(result: RunResult, limits: ToolLimits) -> str:
    """What the model is told about one run: its output, cut to `limits.max_chars`, and why it stopped early."""
    text = truncate(result.output, limits.max_chars)
    if result.status in ("ok", "failed"):  # it ran to its end (a raised exception is in the output)
        return text if text.strip() else "(no output)"
    if result.status == "infra_error":
        logger.error("python tool: sandbox infrastructure error: %s", result.detail)
        return f"error: the sandbox failed ({result.detail}); the code did not run"
    if result.status == "load_error":
        note = f"error: {result.detail}" if result.detail else "error: the program did not run"
    else:
        template = STOPPED.get(result.status, "stopped: " + result.status)
        note = template.format(timeout=limits.timeout_s, bytes=limits.max_output_bytes)
    return f"{text}\n{note}" if text.strip() else note


def truncate(text: str, max_chars: int) -> str:
    """`text`, or its head and tail with a marker saying how much was left out, within `max_chars` characters."""
    if len(text) <= max_chars:
        return text
    marker = f"\n... [{len(text) - max_chars} characters cut] ...\n"
    keep = max(0, max_chars - len(marker))
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]
