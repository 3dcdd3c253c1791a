"""The stdin/stdout launcher, in the program's process: a fresh copy of the program per case, run as `python prog.py`
would run it.

For ("cases", inputs, seconds, max bytes) from the tests' process (channel.py's `Channel.run_cases`), `serve_stdio`
forks a child per input, with the input on stdin and a pipe on stdout, and answers ("out", stdout, how it ended) as
each ends (one request for all the cases: a request per case would cost a wake-up of each side per case). The child
runs the program as the main module, then the interpreter's own shutdown in Py_FinalizeEx's order (non-daemon
threads, atexit handlers, flushing stdout), so an answer printed by a thread or an atexit handler counts.

Trusts: nothing of the program, which runs here. This process holds the inputs only, never the expected outputs,
the nonce or the verdict fd; the copies hold neither this process's pipes nor anything of the tests, and each has a
CPU rlimit of its case's seconds. Imports: wire.py (messages), process.py (clock, children, fds).

Every runner gives the program what `python prog.py` would (here, for calls.py too): the program is written to
`prog.py` in its working directory (`write_program`), compiled under that path (tracebacks show its lines), with
`__file__` naming it (`program_namespace`), and its process's `sys.argv` is `["prog.py"]` (`as_script`), so the
judges' `if len(sys.argv) > 1: sys.stdin = open(sys.argv[1])` reads the test's stdin, as it does there.
"""

from __future__ import annotations

import builtins
import os
import sys

from .process import close_fds_except, now, wait_child
from .wire import receive, send, to_bytes

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


PROGRAM_FILE = "prog.py"  # the program's file, in its working directory (/work inside bubblewrap)


def write_program(program: str) -> str:
    """Write `program` to PROGRAM_FILE in the working directory; its absolute path (`__file__` under `python
    prog.py` since Python 3.9)."""
    path = os.path.join(os.getcwd(), PROGRAM_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = to_bytes(program)
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    return path


def as_script(path: str) -> None:
    """Make this process's `sys` what `python prog.py` gives the program (in the directory of `path`, the program's
    file): its argv, its original argv, and its directory first on `sys.path`. The harness's own argv (`-c` and its
    source) is no business of the program's."""
    sys.argv = [os.path.basename(path)]
    sys.orig_argv = [sys.executable, *sys.argv]
    sys.path.insert(0, os.path.dirname(path))


def program_namespace(name: str, path: str) -> dict[str, Any]:
    """The globals a program runs in: module `name` from the file at `path`, with `exit` and `quit`, which `site`
    would define (programs call them; the harness runs with -S)."""
    return {"__name__": name, "__file__": path, "__builtins__": builtins, "exit": sys.exit, "quit": sys.exit}


def serve_stdio(program: str, path: str, req_fd: int, resp_fd: int, out_fd: int) -> None:
    """For ("cases", inputs, seconds, max bytes): for each input, run a fresh copy of the program (a child of this
    process) with that input on stdin, and answer ("out", stdout, how it ended) as each ends (one message for all
    the inputs: a request per case would cost a wake-up of each side per case). This process holds the inputs
    only, never the expected outputs; the copies hold neither this process's pipes nor anything of the tests."""
    import resource

    try:
        code = compile(program, path, "exec")
        broken = ""
    except BaseException as e:  # every case fails with the reason
        code, broken = None, f"load error: {type(e).__name__}: {str(e)[:300]}"
    try:
        _, texts, seconds, max_bytes = receive(req_fd)
    except BaseException:
        return
    for text in texts:
        if code is None:
            send(resp_fd, ("out", "", broken))
            continue
        stdin = os.memfd_create("stdin")
        data = to_bytes(text)
        while data:
            data = data[os.write(stdin, data) :]
        os.lseek(stdin, 0, 0)
        out_r, out_w = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.dup2(stdin, 0)
                os.dup2(out_w, 1)
                os.dup2(out_fd, 2)
                close_fds_except({0, 1, 2})
                cpu = resource.getrlimit(resource.RLIMIT_CPU)[1]
                limit = int(seconds) + 1 if cpu < 0 else min(cpu, int(seconds) + 1)
                resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))
                status = _run_main(code, path)
            finally:
                os._exit(status)
        os.close(out_w)
        os.close(stdin)
        send(resp_fd, ("out", *_collect(pid, out_r, now() + seconds, max_bytes)))
        os.close(out_r)


def _run_main(code: Any, path: str) -> int:
    """Run a program (compiled from its file at `path`) as `python prog.py` would, with this process's stdin and
    stdout; its exit status.

    After the main module ends (or raises, or calls sys.exit) comes the interpreter's own shutdown, in
    Py_FinalizeEx's order: wait for the program's non-daemon threads, run its atexit handlers, flush stdout. So an
    answer printed by a `Thread(target=main)` or an atexit handler counts, whatever the machine's load."""
    import atexit  # a builtin module: no import cost

    atexit._clear()  # handlers of this launcher's process are not the program's
    as_script(path)  # here, not in the launcher, whose imports must not find what a case wrote to its directory
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    out = sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    status = _run_module(lambda: exec(code, program_namespace("__main__", path)))
    threading = sys.modules.get("threading")
    if threading is not None:  # only `threading` starts threads the interpreter waits for
        _run_module(threading._shutdown)
    atexit._run_exitfuncs()  # each handler's exception is printed and ignored, as at exit
    for stream in (sys.stdout, out):  # a program may have replaced sys.stdout; what it wrote to ours still counts
        try:
            if not stream.closed:
                stream.flush()
        except BaseException:
            return 120  # CPython's status when flushing stdout fails at exit
    return status


def _run_module(run: Callable[[], object]) -> int:
    """Run the main module (or the wait for its threads): 0, SystemExit's status, or 1 after printing the
    traceback of any other exception."""
    try:
        run()
    except SystemExit as e:
        return 0 if e.code is None else e.code if type(e.code) is int else 1
    except BaseException:
        import traceback  # only here: importing it costs more than running a small program

        traceback.print_exc()
        return 1
    return 0


def _collect(pid: int, out_r: int, deadline: float, max_bytes: int) -> tuple[str, str]:
    """Read a case's stdout until it closes and the process exits, or the deadline: (stdout, how it ended)."""
    import select

    chunks, size, ended = [], 0, ""
    while not ended:
        wait = deadline - now()
        if wait <= 0:
            ended = "timeout"
        elif select.select([out_r], [], [], wait)[0]:
            chunk = os.read(out_r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                ended = "output_limit"
    if not ended:  # stdout closed: wait for the exit status
        status = wait_child(pid, deadline)
        if status is not None:
            return b"".join(chunks).decode("utf-8", "replace"), f"exit {os.waitstatus_to_exitcode(status)}"
        ended = "timeout"
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except OSError:
        pass
    return "", ended
