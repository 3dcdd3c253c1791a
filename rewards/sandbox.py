"""A local sandbox for model-written programs, used by the code reward and by code evaluation.

Each worker slot keeps one long-lived sandbox: bubblewrap (`bwrap`, Debian package `bubblewrap`) running the
harness (rewards/_harness.py) as a fork server, Python already started and its modules loaded. Per program the
server forks a fresh child, which applies the limits and runs the program and its tests. Isolation:
  - namespaces: no network, its own pid/ipc/uts namespaces, a read-only view of `/usr` and the Python installation
    only, tmpfs working directory and /tmp, an empty environment, `--die-with-parent`; the server is the pid
    namespace's init (`--as-pid-1`), which no process inside can SIGKILL or SIGSTOP;
  - a real unprivileged uid (one per worker slot) when the host runs as root: RLIMIT_NPROC is ignored for root
    (kernel/fork.c), and a user namespace would map the sandbox's uid back to root outside, so as root we let
    bubblewrap skip the user namespace and keep only CAP_SETUID/CAP_SETGID, and each program's child drops to that
    uid itself; as a normal user, `--unshare-all` with a user namespace is used;
  - per program (set in the child after the fork): rlimits on CPU time, address space, file size, processes and
    message queues, a cap on output bytes, and a wall-clock timeout;
  - between programs every process of the slot's uid is killed and must have exited, /work and /tmp are wiped and
    no System V IPC object may remain; when that fails (or the server dies) the host restarts the sandbox, so one
    program never sees another's processes or files.
Without bubblewrap the same harness runs with rlimits only, one fresh server per program (a child subreaper, which
kills what the program left, by pid, before it is stopped), and the log says so loudly on every sandbox start.
Programs then run as the current user, or, when that is root, as the slot's unprivileged uid; where no such uid
can run the interpreter (e.g. Python under /root, mode 0700) the sandbox refuses to start (`SandboxUnavailable`)
rather than run programs as root, which could kill(-1) every process on the machine, unless
`isolation="unsafe-root"` says to take that risk. The harness itself refuses to run a program as root unless the
host passed that opt-out.

The verdict cannot be forged by the program: the host sends each program's pipes straight to the server over
SCM_RIGHTS; the child forks the program's process *before* it reads the tests and the nonce, runs the tests in its
own process (non-dumpable: the program cannot ptrace it or read its memory or fds) and calls into the program
through a proxy that returns plain decoded data, then writes the count of passed tests on a pipe the program never
holds, keyed with the nonce. The server itself never reads a program, a test or a nonce. Exit codes and stdout are
not read for the verdict. Infrastructure failures (bwrap cannot start, the server dies, a broken test) give
`score=None`, never 0.

Programs run in parallel on a thread pool bounded by the number of cores; each thread only waits on pipes, so the
reward stays usable from any thread (e.g. TRL's training loop or a Prefect task).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import queue
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, get_args

from grpo_pipeline.rewards import _harness
from grpo_pipeline.rewards._harness import DecodeError

logger = logging.getLogger(__name__)

HARNESS_SOURCE = (Path(__file__).with_name("_harness.py")).read_text()
_BASE_UID = 61000  # slot uids are 61000 + slot; no passwd entry is needed
_SANDBOX_UID = 65534  # the uid seen inside a user namespace (non-root hosts)
_GRACE_S = 0.5  # the host kills this long after the harness's own deadline
_OUTPUT_GRACE_S = 0.25  # how long the output pipe may stay open after the verdict
_START_TIMEOUT_S = 20.0  # for a worker's sandbox to start and load the harness
_CLEAN_TIMEOUT_S = 5.0  # for a worker to kill and wipe what a program left

# "auto": bubblewrap when it works, else rlimits only (as root: under an unprivileged uid, or refused);
# "bwrap": bubblewrap or an error; "none": rlimits only (as root: under an unprivileged uid, or refused);
# "unsafe-root": as "auto", but where nothing else works as root, programs run AS ROOT (you accept the risk).
Isolation = Literal["auto", "bwrap", "none", "unsafe-root"]


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run programs here with the isolation asked for; the message says what to change."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation for one program run (all per program)."""

    timeout_s: float = 5.0  # wall clock for loading the program and running all its tests
    memory_mb: int = 1024  # RLIMIT_AS
    cpu_s: int | None = None  # RLIMIT_CPU; defaults to ceil(timeout_s) + 1
    file_size_mb: int = 16  # RLIMIT_FSIZE, and the size of the tmpfs work dir
    max_processes: int = 16  # RLIMIT_NPROC for the slot's uid (processes and threads)
    max_output_bytes: int = 1 << 20  # stdout+stderr kept; more kills the program
    workers: int | None = None  # parallel programs; defaults to the usable cores
    isolation: Isolation = "auto"  # see `Isolation`; "auto" never runs programs as root
    python: str | None = None  # interpreter inside the sandbox; defaults to this one's base interpreter
    extra_ro_paths: tuple[str, ...] = ()  # more host paths shown read-only (e.g. a site-packages with numpy)

    def __post_init__(self) -> None:
        if self.isolation not in get_args(Isolation):
            raise ValueError(f"sandbox isolation must be one of {get_args(Isolation)}, got {self.isolation!r}")


@dataclass
class CodeJob:
    """One program and its tests. `spec` is what the harness runs (see rewards/code.py for how it is built)."""

    program: str
    spec: dict[str, Any]


@dataclass
class RunResult:
    """What happened to one program: tests passed out of total, and why it stopped."""

    status: str  # ok | failed | load_error | timeout | output_limit | no_verdict | forged | infra_error
    passed: int = 0
    total: int = 0
    detail: str = ""
    output: str = ""
    seconds: float = 0.0

    @property
    def infra_error(self) -> bool:
        return self.status == "infra_error"

    def score(self, mode: Literal["pass", "fraction"] = "pass") -> float | None:
        """1/0 when every test passed ('pass') or the passed fraction ('fraction'); None for infrastructure errors."""
        if self.infra_error:
            return None
        if self.status == "output_limit" or self.total == 0:
            return 0.0
        if mode == "fraction":
            return self.passed / self.total
        return 1.0 if self.status == "ok" else 0.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), e.g. fewer than the machine's under taskset or CI."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@functools.cache
def _base_python() -> tuple[str, str]:
    """(interpreter, installation prefix) of the Python that runs this code, outside any virtualenv."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return exe, os.path.realpath(sys.base_prefix)


@functools.cache
def bwrap_status(python: str | None = None) -> tuple[bool, str]:
    """Whether bubblewrap can start a sandbox here (it may be installed but blocked, e.g. no user namespaces)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bwrap is not installed"
    probe = Sandbox(SandboxConfig(isolation="bwrap", python=python), _probe=True)
    argv = probe._argv(config_text="N")
    argv[argv.index("-c") + 1] = "pass"
    argv = argv[: argv.index("-c") + 2]
    try:
        r = subprocess.run(argv, capture_output=True, timeout=20, env={})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap failed to start: {e}"
    if r.returncode != 0:
        return False, f"bwrap failed to start: {r.stderr.decode(errors='replace').strip()}"
    return True, exe


@functools.cache
def unprivileged_uid_status(python: str) -> tuple[bool, str]:
    """Whether the slots' unprivileged uids can run `python` here: what the host needs to drop root without bwrap.

    Programs import the standard library after the drop, so the installation must be open to other users, and the
    kernel must let us become that uid (inside a user namespace it may be unmapped); so we try it for real.
    """
    argv = [python, "-I", "-S", "-c", "import os, sys; sys.exit(0 in os.getresuid())"]
    try:
        r = subprocess.run(
            argv, user=_BASE_UID, group=_BASE_UID, extra_groups=[], env={}, cwd="/", capture_output=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError) as e:
        closed = _closed_dir(python)
        hint = f" ({closed} is mode {os.stat(closed).st_mode & 0o777:04o}: closed to other users)" if closed else ""
        return False, f"uid {_BASE_UID} cannot run {python}{hint}: {e}"
    if r.returncode != 0:
        return False, f"{python} fails as uid {_BASE_UID}: {r.stderr.decode(errors='replace').strip()[-500:]}"
    return True, f"uid {_BASE_UID}"


def _closed_dir(path: str) -> str | None:
    """The first directory above `path` that other users cannot pass through, if any."""
    for d in reversed(Path(path).parents):
        try:
            if not os.stat(d).st_mode & 0o001:
                return str(d)
        except OSError:
            return None
    return None


def _refusal(no_bwrap: str, no_uid: str) -> str:
    """The one message users see when the sandbox will not run programs as root."""
    return (
        f"the code sandbox refuses to run model-written programs as root. This process runs as root, bubblewrap "
        f"is not used ({no_bwrap}), and {no_uid}; a program running as root could kill every process on this "
        f"machine. Fix one of: install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap); run as a normal "
        f"user; or use a Python that other users can execute (the sandbox's `python` setting, e.g. "
        f"/usr/bin/python3, or chmod o+x on the directories above it). To run programs as root anyway, at your "
        f"own risk: isolation='unsafe-root'."
    )


class Sandbox:
    """Runs `CodeJob`s in isolated processes, in parallel. Thread-safe; one instance can serve many callers.

    Raises SandboxUnavailable (at construction, before any program runs) where it cannot isolate programs as
    `config.isolation` asks, e.g. as root without bubblewrap and without a usable unprivileged uid.
    """

    def __init__(self, config: SandboxConfig | None = None, *, _probe: bool = False) -> None:
        self.config = config or SandboxConfig()
        c = self.config
        self.python, prefix = (c.python, str(Path(c.python).resolve().parent.parent)) if c.python else _base_python()
        self.python_prefix = prefix
        self.is_root = os.geteuid() == 0
        self.workers = c.workers or usable_cores()
        if _probe:  # bwrap_status's probe: only builds the command line
            self.isolated, self.drop_uid, self.as_root = True, self.is_root, False
        else:
            self._choose_isolation()
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")
        self._workers: list[_Worker | None] = [None] * self.workers  # started on first use, restarted when broken
        weakref.finalize(self, _stop_all, self._workers)

    def _choose_isolation(self) -> None:
        """Set `isolated` (inside bwrap), `drop_uid` (programs run as 61000 + slot) and `as_root`; or refuse.

        Raises SandboxUnavailable where programs would run as root and `isolation` is not "unsafe-root".
        """
        c = self.config
        self.isolated = self.drop_uid = self.as_root = False
        if c.isolation == "none":
            no_bwrap = "isolation='none' was requested"
        else:
            ok, no_bwrap = bwrap_status(c.python)
            if ok:
                self.isolated, self.drop_uid = True, self.is_root
                return
            if c.isolation == "bwrap":
                hint = "Debian/Ubuntu: apt-get install bubblewrap"
                raise SandboxUnavailable(f"sandbox isolation 'bwrap' was requested but {no_bwrap} ({hint})")
        if not self.is_root:
            logger.warning(
                "SANDBOX ISOLATION IS OFF (%s): programs run with rlimits only, as your user (uid %d): they can read "
                "and change your files, signal your processes and use the network. Install bubblewrap (apt-get "
                "install bubblewrap) before running untrusted code.",
                no_bwrap,
                os.geteuid(),
            )
            return
        self.drop_uid, no_uid = unprivileged_uid_status(self.python)
        if self.drop_uid:
            logger.warning(
                "SANDBOX ISOLATION IS OFF (%s): programs run with rlimits only, as unprivileged uids %d-%d: they can "
                "read world-readable files and use the network. Install bubblewrap (apt-get install bubblewrap) "
                "before running untrusted code.",
                no_bwrap,
                _BASE_UID,
                _BASE_UID + self.workers - 1,
            )
            return
        if c.isolation != "unsafe-root":
            raise SandboxUnavailable(_refusal(no_bwrap, no_uid))
        self.as_root = True
        logger.critical(
            "SANDBOX RUNS MODEL-WRITTEN PROGRAMS AS ROOT (isolation='unsafe-root'; %s; %s): ANY PROGRAM CAN KILL EVERY "
            "PROCESS ON THIS MACHINE, READ AND DELETE EVERY FILE AND USE THE NETWORK. Install bubblewrap (apt-get "
            "install bubblewrap) and drop isolation='unsafe-root'.",
            no_bwrap,
            no_uid,
        )

    def _stop_workers(self) -> None:
        _stop_all(self._workers)

    # ------------------------------------------------------------ command line
    def _limits(self) -> dict[str, int]:
        c = self.config
        cpu = c.cpu_s if c.cpu_s is not None else math.ceil(c.timeout_s) + 1
        return {
            "RLIMIT_CPU": cpu,
            "RLIMIT_AS": c.memory_mb << 20,
            "RLIMIT_FSIZE": c.file_size_mb << 20,
            "RLIMIT_NPROC": c.max_processes,
            "RLIMIT_CORE": 0,
            "RLIMIT_MSGQUEUE": 0,  # POSIX message queues outlive processes; none are allowed
        }

    def _argv(self, config_text: str) -> list[str]:
        harness = [self.python, "-I", "-S", "-c", HARNESS_SOURCE, config_text]
        if not self.isolated:
            return harness
        tmpfs_bytes = str(self.config.file_size_mb << 20)
        # --as-pid-1: the harness's server is the namespace's init, which no process inside can SIGKILL or SIGSTOP,
        # and every process a program leaves behind is re-parented to it (so it can tell when all are gone)
        argv = ["bwrap", "--die-with-parent", "--new-session", "--clearenv", "--as-pid-1"]
        if self.is_root:  # no user namespace: the harness drops to a real unprivileged uid (see module docstring)
            argv += [
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
            ]
        else:
            argv += ["--unshare-all", "--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID)]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        made: set[str] = set()
        for path in (self.python_prefix, *self.config.extra_ro_paths):
            if path.startswith("/usr/") or not os.path.exists(path):
                continue
            for parent in reversed(Path(path).parents):  # bwrap would create them 0700
                if str(parent) != "/" and str(parent) not in made:
                    made.add(str(parent))
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", path, path]
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--size",
            tmpfs_bytes,
            "--tmpfs",
            "/tmp",
            "--perms",
            "0777",
            "--size",
            tmpfs_bytes,
            "--tmpfs",
            "/work",
            "--chdir",
            "/work",
            "--",
        ]
        return argv + harness

    # ------------------------------------------------------------ running
    def run(self, jobs: Sequence[CodeJob]) -> list[RunResult]:
        """Run every job (in parallel, bounded by `workers`); results in the same order."""
        return list(self._pool.map(self._run_with_slot, jobs))

    def close(self) -> None:
        """Wait for running jobs, then stop every worker's sandbox."""
        self._pool.shutdown(wait=True)
        self._stop_workers()

    def _run_with_slot(self, job: CodeJob) -> RunResult:
        slot = self._slots.get()
        try:
            return self.run_one(job, slot)
        except Exception as e:  # a bug or an OS error on our side: never a silent 0
            logger.exception("sandbox infrastructure error")
            self._workers[slot] = _stop(self._workers[slot])
            return RunResult(status="infra_error", detail=f"{type(e).__name__}: {e}")
        finally:
            self._slots.put(slot)

    def _start_worker(self, slot: int) -> _Worker:
        """Start the fork server of slot `slot` and wait until it has loaded (its uid is 61000 + slot)."""
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # "clean": kill(-1) between programs, only where it cannot reach beyond this worker's pid namespace
        config: dict[str, Any] = {"control_fd": server_end.fileno(), "rlimits": self._limits(), "clean": self.isolated}
        uid = _BASE_UID + slot
        if self.drop_uid:
            config["uid"] = uid
        if self.as_root:  # otherwise the harness refuses to run a program as root (a second line of defence)
            config["allow_root"] = True
        workdir = None
        if not self.isolated:
            workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
            if self.drop_uid:
                os.chown(workdir, uid, uid)
        log = tempfile.TemporaryFile(prefix="grpo-sandbox-log-")  # noqa: SIM115 (the worker keeps it; _stop closes it)
        try:
            proc = subprocess.Popen(
                self._argv(_harness.encode(config)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(server_end.fileno(),),
                cwd=workdir,
                env={},
                start_new_session=True,  # its own process group, killed as a whole
            )
        except BaseException:
            host_end.close()
            log.close()
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            server_end.close()
        worker = _Worker(proc, host_end, log, workdir)
        ready, _, _ = select.select([host_end], [], [], _START_TIMEOUT_S)
        if not ready or host_end.recv(16) != b"U":
            _stop(worker)
            raise _StartError(worker.log_tail())
        return worker

    def run_one(self, job: CodeJob, slot: int = 0) -> RunResult:
        """Run one job on slot `slot`'s worker (one caller per slot at a time; `run` hands out the slots)."""
        c = self.config
        start = time.monotonic()
        worker = self._workers[slot]
        if worker is None or worker.proc.poll() is not None:
            _stop(worker)
            try:
                worker = self._workers[slot] = self._start_worker(slot)
            except _StartError as e:
                self._workers[slot] = None
                logger.error("sandbox did not start: %s", e)
                return RunResult(
                    status="infra_error",
                    detail="sandbox did not start",
                    output=str(e),
                    seconds=time.monotonic() - start,
                )
        nonce = secrets.token_bytes(32)
        spec = dict(job.spec, nonce=nonce.hex(), timeout=c.timeout_s)
        spec_r, spec_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            # the three fds go straight to the server, which hands them to a fresh child for this program only
            socket.send_fds(worker.control, [b"R"], [spec_r, verdict_w, out_w])
        finally:
            for fd in (spec_r, verdict_w, out_w):
                os.close(fd)
        try:
            result, server_died = self._supervise(worker, job, spec, nonce, spec_w, verdict_r, out_r, start)
        finally:
            for fd in (spec_w, verdict_r, out_r):
                os.close(fd)
        # Without bwrap the server kills what the program left (its descendants) and is replaced after every
        # program; with bwrap it is reused only when it also wiped the files and no process of the slot is left.
        clean = not server_died and worker.clean()
        if not (clean and self.isolated):
            if not clean and not server_died:
                logger.warning("sandbox worker %d could not clean up after a program; restarting it", slot)
            self._workers[slot] = _stop(worker)
        return result

    def _supervise(
        self,
        worker: _Worker,
        job: CodeJob,
        spec: dict[str, Any],
        nonce: bytes,
        spec_w: int,
        verdict_r: int,
        out_r: int,
        start: float,
    ) -> tuple[RunResult, bool]:
        """Feed the program and its tests, collect the verdict and the output; (result, whether the server died)."""
        c = self.config
        # message 1: how the program runs (stdin/stdout cases, or loaded once and called) and the program itself;
        # message 2, read only after the program's process is forked: the tests and the nonce
        mode = "stdio" if spec["kind"] == "stdio" else "load"
        pending = _frame(_harness.to_bytes(f"{mode}\n{job.program}")) + _frame(_harness.to_bytes(_harness.encode(spec)))
        os.set_blocking(spec_w, False)
        verdict, output = bytearray(), bytearray()
        output_bytes, server_died, verdict_done = 0, False, False
        killed: str | None = None
        deadline = start + c.timeout_s + _GRACE_S
        with selectors.DefaultSelector() as sel:
            sel.register(spec_w, selectors.EVENT_WRITE, "spec")
            sel.register(verdict_r, selectors.EVENT_READ, "verdict")
            sel.register(out_r, selectors.EVENT_READ, "out")
            sel.register(worker.control, selectors.EVENT_READ, "server")
            readers = 2
            while readers:
                left = deadline - time.monotonic()
                if left <= 0:
                    # after the verdict, only a process the program left behind can hold the output pipe open
                    killed = None if verdict_done else "timeout"
                    break
                for key, _ in sel.select(timeout=left):
                    if key.data == "spec":
                        try:
                            pending = pending[os.write(spec_w, pending) :]
                        except (BrokenPipeError, BlockingIOError) as e:
                            pending = b"" if isinstance(e, BrokenPipeError) else pending
                        if not pending:
                            sel.unregister(spec_w)
                        continue
                    if key.data == "server":  # the server only speaks when asked: this is its socket closing
                        server_died = True
                        sel.unregister(worker.control)
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fd)
                        readers -= 1
                        if key.data == "verdict":
                            verdict_done = True
                            deadline = min(deadline, time.monotonic() + _OUTPUT_GRACE_S)
                    elif key.data == "verdict":
                        verdict += chunk
                    else:
                        output_bytes += len(chunk)
                        if len(output) < c.max_output_bytes:
                            output += chunk[: c.max_output_bytes - len(output)]
                        if output_bytes > c.max_output_bytes:
                            killed = "output_limit"
                            readers = 0
                            break
        seconds = time.monotonic() - start
        text = output.decode(errors="replace")
        result = _parse_verdict(bytes(verdict), nonce)
        if result is not None:
            result.output, result.seconds = text, seconds
            if killed == "output_limit":  # a verdict was written, but the program flooded its output
                result.status = "output_limit"
            return result, server_died
        if server_died:  # not the program's doing: it cannot signal or trace the server (pid 1, another uid)
            logger.error("sandbox server died during a program: %s", worker.log_tail())
            return RunResult(status="infra_error", detail="the sandbox server died", output=text, seconds=seconds), True
        if killed:
            return RunResult(status=killed, detail=f"killed: {killed}", output=text, seconds=seconds), False
        if not verdict.startswith(_frame(b"started")):
            logger.error("sandbox did not start a program: %s", text.strip()[-2000:])
            return RunResult(status="infra_error", detail="sandbox did not start", output=text, seconds=seconds), False
        return RunResult(
            status="no_verdict", detail="the harness died before writing a verdict", output=text, seconds=seconds
        ), False


class _StartError(RuntimeError):
    """A worker's sandbox did not start (its log tail is the message): its programs score None."""


class _Worker:
    """One long-lived sandbox: bwrap running the harness's fork server as pid 1 of its pid namespace."""

    def __init__(
        self, proc: subprocess.Popen[bytes], control: socket.socket, log: IO[bytes], workdir: str | None
    ) -> None:
        self.proc, self.control, self.log, self.workdir = proc, control, log, workdir

    def clean(self) -> bool:
        """Ask the server to kill what the last program left and wipe its files; False if it did not."""
        try:
            self.control.sendall(b"C")
            ready, _, _ = select.select([self.control], [], [], _CLEAN_TIMEOUT_S)
            return bool(ready) and self.control.recv(16) == b"K"
        except OSError:
            return False

    def log_tail(self) -> str:
        try:
            self.log.seek(0)
            return self.log.read()[-2000:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""


def _stop(worker: _Worker | None) -> None:
    """Kill a worker's sandbox (its process group; bwrap's --die-with-parent takes the namespace with it)."""
    if worker is None:
        return None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()
    worker.control.close()
    worker.log.close()
    if worker.workdir:
        shutil.rmtree(worker.workdir, ignore_errors=True)
    return None


def _stop_all(workers: list[_Worker | None]) -> None:
    for i, worker in enumerate(workers):
        workers[i] = _stop(worker)


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _parse_verdict(data: bytes, nonce: bytes) -> RunResult | None:
    """The verdict ("started", payload, MAC) if the harness wrote one with a valid MAC; None when it wrote none."""
    messages: list[bytes] = []
    pos = 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        if pos + 4 + n > len(data):
            break
        messages.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    if len(messages) < 3:
        return None
    body, mac = messages[1], messages[2].decode(errors="replace")
    try:
        if not secrets.compare_digest(_harness.mac(nonce, body), mac):
            raise ValueError("bad MAC")
        payload = _harness.decode(_harness.from_bytes(body))
        if not isinstance(payload, dict):
            raise ValueError("payload is not a mapping")
        if "infra_error" in payload:
            logger.error("the tests themselves failed to run: %s", payload["infra_error"])
            return RunResult(status="infra_error", detail=str(payload["infra_error"]))
        passed, total = int(payload["passed"]), int(payload["total"])
        loaded, completed = bool(payload["loaded"]), bool(payload["completed"])
    except (ValueError, KeyError, TypeError, DecodeError) as e:
        logger.warning("sandbox verdict rejected (%s); scoring the program 0", e)
        return RunResult(status="forged", detail=str(e))
    if loaded and completed and passed == total:
        status = "ok"
    else:
        status = "timeout" if payload.get("timeout") else "load_error" if not loaded else "failed"
    return RunResult(status=status, passed=passed, total=total, detail=str(payload.get("error") or ""))


@functools.cache
def default_sandbox(config: SandboxConfig | None = None) -> Sandbox:
    """One shared sandbox per config, so rewards built many times reuse one worker pool."""
    return Sandbox(config or SandboxConfig())
