"""The command line of a worker's sandbox: the harness as a fork server, inside bubblewrap where the mode is isolated,
and the rlimits each program's process sets on itself."""

from __future__ import annotations

import math
import os
from pathlib import Path

from grpo_pipeline.rewards import harness
from grpo_pipeline.rewards.sandbox import config as config_module
from grpo_pipeline.rewards.sandbox.config import SANDBOX_UID, Mode, SandboxConfig


def limits(c: SandboxConfig) -> dict[str, int]:
    """The rlimits each program's process sets on itself."""
    cpu = c.cpu_s if c.cpu_s is not None else math.ceil(c.timeout_s) + 1
    return {
        "RLIMIT_CPU": cpu,
        "RLIMIT_AS": c.memory_mb << 20,
        "RLIMIT_FSIZE": c.file_size_mb << 20,
        "RLIMIT_NPROC": c.max_processes,
        "RLIMIT_CORE": 0,
        "RLIMIT_MSGQUEUE": 0,  # POSIX message queues outlive processes; none are allowed
    }


def command_line(c: SandboxConfig, mode: Mode, python: str, prefix: str) -> list[str]:
    """How a worker's sandbox starts: the harness (`python`, from the installation at `prefix`), inside bubblewrap
    where `mode` is isolated. Its config goes on its stdin, never here: every process in the sandbox, the
    program's included, can read the command line (rewards/harness/server.py)."""
    source = config_module.HARNESS_SOURCE or harness.source()
    program = [python, "-I", "-S", "-c", source]
    if not mode.isolated:
        return program
    # --as-pid-1: the harness's server is the namespace's init, which no process inside can SIGKILL or SIGSTOP,
    # and every process a program leaves behind is re-parented to it (so it can tell when all are gone)
    argv = ["bwrap", "--die-with-parent", "--new-session", "--clearenv", "--as-pid-1"]
    return [*argv, *namespace_args(mode), *filesystem_args(c, prefix), "--", *program]


def namespace_args(mode: Mode) -> list[str]:
    """The namespaces and capabilities of a bubblewrap sandbox in `mode`."""
    if not mode.drop_uid:
        return ["--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    # root: no user namespace (it would map the sandbox's uid back to root); the harness drops to a real
    # unprivileged uid itself, so it keeps only CAP_SETUID and CAP_SETGID (see the package docstring)
    unshare = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return [*unshare, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]


def filesystem_args(c: SandboxConfig, prefix: str) -> list[str]:
    """A read-only /usr, the Python installation at `prefix` and `c.extra_ro_paths`; fresh /proc, /dev; tmpfs /tmp
    and /work (the working directory), each as large as `c.file_size_mb`."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    made: set[str] = set()
    for path in (prefix, *c.extra_ro_paths):
        if path.startswith("/usr/") or not os.path.exists(path):
            continue
        for parent in reversed(Path(path).parents):  # bwrap would create them 0700
            if str(parent) != "/" and str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", path, path]
    tmpfs = str(c.file_size_mb << 20)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", tmpfs, "--tmpfs", "/tmp"]
    argv += ["--perms", "0777", "--size", tmpfs, "--tmpfs", "/work", "--chdir", "/work"]
    return argv
