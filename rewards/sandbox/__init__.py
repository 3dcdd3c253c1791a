"""A local sandbox for model-written programs, used by the code reward and by code evaluation.

Each worker slot keeps one long-lived sandbox: bubblewrap (`bwrap`, Debian package `bubblewrap`) running the
harness (rewards/harness/) as a fork server, Python already started and its modules loaded. Per program the
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

The package: `config` (SandboxConfig, CodeJob, RunResult, the isolation Mode), `host` (host checks and the isolation
policy), `command` (the bubblewrap command line and the rlimits), `supervise` (one worker's sandbox and one program
on it), `pool` (Sandbox, the worker slots). The harness (rewards/harness/: the trusted code inside the sandbox,
standard library only) ships into the sandbox as one source, its modules joined; its package docstring says why.
"""

from grpo_pipeline.rewards.sandbox.config import (
    BASE_UID,
    CodeJob,
    Isolation,
    Mode,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
)
from grpo_pipeline.rewards.sandbox.host import bwrap_status, unprivileged_uid_status, usable_cores
from grpo_pipeline.rewards.sandbox.pool import Sandbox, default_sandbox

__all__ = [
    "BASE_UID",
    "CodeJob",
    "Isolation",
    "Mode",
    "RunResult",
    "Sandbox",
    "SandboxConfig",
    "SandboxUnavailable",
    "bwrap_status",
    "default_sandbox",
    "unprivileged_uid_status",
    "usable_cores",
]
