"""Host checks and the isolation policy: can bubblewrap start here, can an unprivileged uid run the interpreter, and
which `Mode` a sandbox runs in (never programs as root without the explicit opt-out)."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from grpo_pipeline.rewards.sandbox.command import command_line
from grpo_pipeline.rewards.sandbox.config import BASE_UID, Mode, SandboxConfig, SandboxUnavailable

logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), e.g. fewer than the machine's under taskset or CI."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@functools.cache
def base_python() -> tuple[str, str]:
    """(interpreter, installation prefix) of the Python that runs this code, outside any virtualenv."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return exe, os.path.realpath(sys.base_prefix)


@functools.cache
def bwrap_status(python: str | None = None) -> tuple[bool, str]:
    """Whether bubblewrap can start a sandbox here (it may be installed but blocked, e.g. no user namespaces)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bwrap is not installed"
    mode = Mode.BWRAP_DROP_UID if os.geteuid() == 0 else Mode.BWRAP
    interpreter, prefix = (python, python_prefix(python)) if python else base_python()
    argv = command_line(SandboxConfig(python=python), mode, interpreter, prefix)
    argv[argv.index("-c") + 1] = "pass"
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
            argv, user=BASE_UID, group=BASE_UID, extra_groups=[], env={}, cwd="/", capture_output=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError) as e:
        closed = closed_dir(python)
        hint = f" ({closed} is mode {os.stat(closed).st_mode & 0o777:04o}: closed to other users)" if closed else ""
        return False, f"uid {BASE_UID} cannot run {python}{hint}: {e}"
    if r.returncode != 0:
        return False, f"{python} fails as uid {BASE_UID}: {r.stderr.decode(errors='replace').strip()[-500:]}"
    return True, f"uid {BASE_UID}"


def closed_dir(path: str) -> str | None:
    """The first directory above `path` that other users cannot pass through, if any."""
    for d in reversed(Path(path).parents):
        try:
            if not os.stat(d).st_mode & 0o001:
                return str(d)
        except OSError:
            return None
    return None


def refusal(no_bwrap: str, no_uid: str) -> str:
    """The one message users see when the sandbox will not run programs as root."""
    return (
        f"the code sandbox refuses to run model-written programs as root. This process runs as root, bubblewrap "
        f"is not used ({no_bwrap}), and {no_uid}; a program running as root could kill every process on this "
        f"machine. Fix one of: install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap); run as a normal "
        f"user; or use a Python that other users can execute (the sandbox's `python` setting, e.g. "
        f"/usr/bin/python3, or chmod o+x on the directories above it). To run programs as root anyway, at your "
        f"own risk: isolation='unsafe-root'."
    )


def python_prefix(python: str) -> str:
    """The installation prefix of an interpreter given by path (bin/python -> its parent's parent)."""
    return str(Path(python).resolve().parent.parent)


def choose_mode(c: SandboxConfig, python: str, workers: int) -> Mode:
    """The isolation mode for `c.isolation` on this host (running `python`, `workers` slots), said loudly when it
    is not bubblewrap; raises SandboxUnavailable where programs would run as root and `isolation` is not
    "unsafe-root"."""
    is_root = os.geteuid() == 0
    if c.isolation == "none":
        no_bwrap = "isolation='none' was requested"
    else:
        ok, no_bwrap = bwrap_status(c.python)
        if ok:
            return Mode.BWRAP_DROP_UID if is_root else Mode.BWRAP
        if c.isolation == "bwrap":
            hint = "Debian/Ubuntu: apt-get install bubblewrap"
            raise SandboxUnavailable(f"sandbox isolation 'bwrap' was requested but {no_bwrap} ({hint})")
    if not is_root:
        logger.warning(
            "SANDBOX ISOLATION IS OFF (%s): programs run with rlimits only, as your user (uid %d): they can read "
            "and change your files, signal your processes and use the network. Install bubblewrap (apt-get "
            "install bubblewrap) before running untrusted code.",
            no_bwrap,
            os.geteuid(),
        )
        return Mode.RLIMITS
    drop_uid, no_uid = unprivileged_uid_status(python)
    if drop_uid:
        logger.warning(
            "SANDBOX ISOLATION IS OFF (%s): programs run with rlimits only, as unprivileged uids %d-%d: they can "
            "read world-readable files and use the network. Install bubblewrap (apt-get install bubblewrap) "
            "before running untrusted code.",
            no_bwrap,
            BASE_UID,
            BASE_UID + workers - 1,
        )
        return Mode.RLIMITS_DROP_UID
    if c.isolation != "unsafe-root":
        raise SandboxUnavailable(refusal(no_bwrap, no_uid))
    logger.critical(
        "SANDBOX RUNS MODEL-WRITTEN PROGRAMS AS ROOT (isolation='unsafe-root'; %s; %s): ANY PROGRAM CAN KILL EVERY "
        "PROCESS ON THIS MACHINE, READ AND DELETE EVERY FILE AND USE THE NETWORK. Install bubblewrap (apt-get "
        "install bubblewrap) and drop isolation='unsafe-root'.",
        no_bwrap,
        no_uid,
    )
    return Mode.UNSAFE_ROOT
