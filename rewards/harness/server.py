"""The fork server, one program's run in a child of it, and the clean-up between programs.

The host starts `python -I -S -c <the harness>` once per worker (once per program without bubblewrap), its config
on stdin; it runs `serve`, a fork server that gets, for each program, three fds over its control socket (SCM_RIGHTS):
  - spec fd (read): message 1 is the program, message 2 the tests and a nonce;
  - verdict fd (write): a "started" marker, then the result and its MAC (blake2b keyed with the nonce);
  - output fd: the program's stdout and stderr.
For each program the server forks a child (`run_program`), which closes every other fd, lowers its rlimits, drops
to an unprivileged uid when the server runs as root (and refuses to go on as root unless the host allowed it),
becomes non-dumpable, reads the program, forks the program's process (calls.py, stdio.py), and only then reads the
tests and the nonce, runs them (checks.py) and writes the verdict. Between programs every process but the server
is killed and must have exited, and /work and /tmp are wiped (`_clean`); without a pid namespace the server, a
child subreaper, kills its descendants by pid instead (`_kill_descendants`).

The config arrives on the server's stdin (`read_config`), which the host writes and closes at start, never in its
argv: a program's process is a fork of the server, and its `sys.argv`, `sys.orig_argv` and /proc/<pid>/cmdline
(any process's, which every process may read) hold only `-c` and the harness's public source; the program then
gets `python prog.py`'s argv (stdio.py, `as_script`).

Trusts: the host's config (its stdin at start) and the host's messages on the control socket. The server itself
never reads a program, a test or a nonce. Imports: wire.py, process.py, stdio.py, calls.py, channel.py, checks.py;
it comes last in the harness, whose last lines start the server.
"""

# ruff: noqa: SIM105  (try/except/pass, not contextlib.suppress: importing contextlib costs ~1 ms per sandbox start)
from __future__ import annotations

import gc
import os
import sys

from .calls import serve_program
from .channel import Channel
from .checks import describe, run_tests
from .process import close_fds_except, now, wait_child
from .stdio import write_program
from .wire import decode, encode, from_bytes, mac, read_message, receive, to_bytes, write_message

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def serve(config: dict[str, Any]) -> None:
    """The long-lived server: pid 1 of the sandbox's pid namespace, Python and these modules already loaded.

    Control socket (SOCK_SEQPACKET) from the host: b"R" + three fds (spec, verdict, output) runs one program in a
    fresh child; b"C" makes sure every process but this one is gone and /work and /tmp are empty, and answers b"K"
    (clean) or b"D" (something is left: the host restarts the sandbox). The server never reads a program, a test or
    a nonce. With config["clean"] (only inside a pid namespace: kill(-1) must not reach the host's processes) the
    child cleans up itself after the verdict, and the server checks that it did.
    """
    import signal
    import socket

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    _prctl_not_dumpable()
    if not config.get("clean"):  # no pid namespace: what a program leaves is re-parented here, not to init
        _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    import resource  # noqa: F401  (loaded once here, not per program)

    _warm_up()
    ctl = socket.socket(fileno=config["control_fd"])
    ctl.sendall(b"U")
    runner = None
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 3)
        except OSError:
            os._exit(1)
        if not msg:  # the host closed the socket
            os._exit(0)
        if msg == b"R" and len(fds) == 3:
            runner = os.fork()
            if runner == 0:
                code = 1  # 0 only when run_program returned: the server's clean-up trusts it
                try:
                    run_program(config, *fds)
                    code = 0
                except BaseException:  # on the run's output pipe once run_program redirected it, else the log
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        elif msg == b"C":
            done = _clean(config, runner) if config.get("clean") else _kill_descendants(now() + 2.0)
            ctl.sendall(b"K" if done else b"D")
            runner = None
        for fd in fds:
            os.close(fd)


def _warm_up() -> None:
    """Do once here what every program's processes would each do first, then fork: a process's first `compile`,
    text streams, MAC and wire message set up state lazily (the first `compile` alone costs ~2 ms of CPU in a
    freshly forked child, against ~0.1 ms once the parent has compiled), and a child inherits it ready. Then freeze
    the server's objects: no garbage collection in a child ever walks them, which would copy their pages."""
    compile("import sys\nprint(sum(map(int, sys.stdin.readline().split())))", "<warm-up>", "exec")
    decode(encode({"cases": [("1 2\n", "3\n")], "total": 1, "timeout": 1.5, "nonce": b"\x00".hex()}))
    mac(b"\x00" * 32, b"warm-up")
    with open(os.devnull, encoding="utf-8", errors="replace") as stdin, open(os.devnull, "w", encoding="utf-8") as out:
        out.write(stdin.read())
    import atexit  # noqa: F401
    import select  # noqa: F401

    gc.collect()
    gc.freeze()


def run_program(config: dict[str, Any], spec_fd: int, verdict_fd: int, out_fd: int) -> None:
    """One program, in a child of the server: rlimits, uid, fork the program, run the tests, write the verdict."""
    import resource

    start = now()
    gc.disable()  # this process's objects form no cycles; a collection would only copy the server's pages
    # stdio becomes this run's output pipe, and every other fd of the server (its control socket) is closed; the
    # received fds are above 2, as the server's own stdio is open
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    close_fds_except({0, 1, 2, spec_fd, verdict_fd})
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _become_sandbox_user(config)
    message = from_bytes(read_message(spec_fd))  # the mode ("stdio" or "load"), a newline, the program
    mode, _, program = message.partition("\n")
    path = write_program(program)  # as the slot's uid, into the working directory (wiped between programs)
    write_message(verdict_fd, b"started")  # from here on, a run that writes no verdict is the program's doing
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (spec_fd, verdict_fd, req_w, resp_r):
                os.close(fd)
            sys.path.extend(config.get("import_paths", ()))  # extra_ro_paths: the program's imports, not the tests'
            gc.enable()  # the program's process collects garbage as Python does
            serve_program(mode, program, path, req_r, resp_w, 2)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    spec = receive(spec_fd)  # the tests and the nonce arrive only now, after the program's process was forked
    os.close(spec_fd)
    channel = Channel(pid, req_w, resp_r, start + float(spec["timeout"]))
    try:
        payload = run_tests(spec, channel)
    except BaseException as e:  # tests that cannot be set up (not the program): an infrastructure error
        payload = {"infra_error": describe(e)}
    channel.kill("done")
    body = to_bytes(encode(payload))
    write_message(verdict_fd, body)
    write_message(verdict_fd, mac(bytes.fromhex(spec["nonce"]), body).encode())
    if config.get("clean"):  # the fast path of the server's clean-up: no fork, done before the host asks
        for fd in (verdict_fd, 0, 1, 2):
            os.close(fd)
        _kill_all()
        deadline = start + float(spec["timeout"]) + 1.0
        wait_child(pid, deadline)  # the program's process, woken when it is gone; then a check for any other
        _wait_until_others_exited(deadline)
        _wipe_all()


def _wait_until_others_exited(deadline: float) -> None:
    """Wait until every other process in the namespace but pid 1 has exited (is a zombie or gone)."""
    import time

    me = os.getpid()
    while True:
        alive = False
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, me):
                try:
                    with open(f"/proc/{name}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                alive = alive or state not in ("Z", "X")
        if not alive:
            return
        if now() > deadline:
            raise OSError("processes are still running")
        time.sleep(0.0002)


_LIBC: Any = None  # the C library, loaded once in the server (every child inherits it)


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _prctl(option: int, value: int) -> None:
    if _libc().prctl(option, value, 0, 0, 0) != 0:
        raise OSError(f"prctl({option}, {value}) failed")


def _prctl_not_dumpable() -> None:
    """Make this process non-dumpable: no ptrace, and its /proc memory, fds and environ belong to root."""
    _prctl(4, 0)  # PR_SET_DUMPABLE


def _become_sandbox_user(config: dict[str, Any]) -> None:
    """Drop to the slot's unprivileged uid (when the server runs as root) and stay non-dumpable.

    Raises PermissionError rather than go on as root, unless the host allowed it (isolation='unsafe-root'): a
    program running as root outside a pid namespace can kill every process on the machine with kill(-1).
    """
    uid = config.get("uid")
    if uid is not None and os.getuid() == 0:
        # A real unprivileged uid: RLIMIT_NPROC counts (it is ignored for root), and no capability survives.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if 0 in os.getresuid() and not config.get("allow_root"):
        raise PermissionError("the sandbox harness refuses to run a program as root (no unprivileged uid was given)")
    _prctl_not_dumpable()  # inherited over fork, and setuid may reset it (fs.suid_dumpable): set it again


def _in_child_as_sandbox_user(config: dict[str, Any], fn: Callable[[], object]) -> bool:
    """Run fn() in a child with the slot's uid; True when it returned normally."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _become_sandbox_user(config)
            fn()
            code = 0
        finally:
            os._exit(code)
    while True:
        try:
            return os.waitpid(pid, 0)[1] == 0
        except InterruptedError:
            continue


def _kill_all() -> None:
    if 0 in os.getresuid():  # as root, kill(-1) reaches every process of the machine unless a pid namespace holds it
        raise PermissionError("refusing kill(-1) as root")
    try:
        os.kill(-1, 9)  # every process this uid may signal in this pid namespace, except this one and pid 1
    except ProcessLookupError:
        pass


def _kill_descendants(deadline: float) -> bool:
    """Kill and reap every process below this server (a child subreaper); True when none is left.

    Outside a pid namespace, kill(-1) would reach processes that are not the program's (another sandbox's with the
    same uid, or, as root, the whole machine), so the server kills its own children, by pid, until none is left: a
    killed process's children are re-parented to it in turn. A pid cannot be reused before this server reaps it.
    """
    import time

    me = os.getpid()
    while True:
        for pid in _children_of(me):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        if _reap_exited():
            return True
        if now() > deadline:
            return False
        time.sleep(0.0005)


def _children_of(parent: int) -> list[int]:
    """Pids whose parent is `parent`, from /proc/<pid>/stat (the `children` file needs CONFIG_PROC_CHILDREN)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                found.append(int(name))
    return found


def _reap_all(deadline: float) -> bool:
    """Wait until this server (pid 1) has no child left, i.e. no other process exists in the namespace."""
    import time

    while not _reap_exited():
        if now() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _reap_exited() -> bool:
    """Reap every child of this process that has exited; True when no child is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _wipe(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
            _wipe(entry.path)
            os.rmdir(entry.path)
        else:
            os.unlink(entry.path)


def _wipe_all() -> None:
    for path in ("/work", "/tmp"):
        _wipe(path)
    for kind in ("shm", "sem", "msg"):  # System V IPC objects outlive processes: any left means a restart
        with open("/proc/sysvipc/" + kind) as f:
            if len(f.read().strip().splitlines()) > 1:
                raise OSError(f"System V {kind} objects left")


def _clean(config: dict[str, Any], runner: int | None) -> bool:
    """Kill everything the last program left, reap it, and wipe its files; False when that did not work."""
    deadline = now() + 2.0
    # Fast path: the run's child killed everything, saw it exit and wiped the files (it exits 0 only then); after
    # 0.5 s it is stopped or stuck, and the slow path kills it.
    try:
        status = None if runner is None else wait_child(runner, deadline - 1.5)
    except ChildProcessError:
        status = None
    if status == 0 and _reap_all(deadline):
        return True
    killed = _in_child_as_sandbox_user(config, _kill_all)
    return killed and _reap_all(deadline) and _in_child_as_sandbox_user(config, _wipe_all) and _reap_all(deadline)


def read_config() -> dict[str, Any]:
    """The host's config, read from stdin to its end; stdin is then /dev/null (see the module docstring)."""
    chunks = []
    while chunk := os.read(0, 1 << 16):
        chunks.append(chunk)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return decode(from_bytes(b"".join(chunks)))


def main() -> None:
    serve(read_config())


if __name__ == "__main__":
    main()
