"""The sandbox's settings and results: what a caller configures (`SandboxConfig`), gives (`CodeJob`) and gets back
(`RunResult`), the isolation `Mode` the host settles on, and the fixed limits of the host side."""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, get_args

# Another program to start in the harness's place (tests, benchmarks/stdio.py --before); None: the harness itself
# (rewards/harness/, joined into one source: command.command_line)
HARNESS_SOURCE: str | None = None
BASE_UID = 61000  # slot uids are 61000 + slot; no passwd entry is needed
SANDBOX_UID = 65534  # the uid seen inside a user namespace (non-root hosts)
GRACE_S = 0.5  # the host kills this long after the harness's own deadline
OUTPUT_GRACE_S = 0.25  # how long the output pipe may stay open after the verdict
START_TIMEOUT_S = 20.0  # for a worker's sandbox to start and load the harness
CLEAN_TIMEOUT_S = 5.0  # for a worker to kill and wipe what a program left
SANDBOX_TMPFS = ("/tmp", "/work")  # mounted empty in every sandbox, over whatever the host has there

# "auto": bubblewrap when it works, else rlimits only (as root: under an unprivileged uid, or refused);
# "bwrap": bubblewrap or an error; "none": rlimits only (as root: under an unprivileged uid, or refused);
# "unsafe-root": as "auto", but where nothing else works as root, programs run AS ROOT (you accept the risk).
Isolation = Literal["auto", "bwrap", "none", "unsafe-root"]


class Mode(StrEnum):
    """How programs are isolated here, settled once per sandbox (host.choose_mode) from `Isolation` and the host."""

    BWRAP = "bwrap"  # bubblewrap with a user namespace (a normal user)
    BWRAP_DROP_UID = "bwrap-drop-uid"  # bubblewrap without a user namespace, programs drop to 61000 + slot (root)
    RLIMITS = "rlimits"  # rlimits only, as the current (non-root) user
    RLIMITS_DROP_UID = "rlimits-drop-uid"  # rlimits only, programs drop to 61000 + slot (root)
    UNSAFE_ROOT = "unsafe-root"  # rlimits only, programs run as root (isolation="unsafe-root")

    @property
    def isolated(self) -> bool:
        """Inside bubblewrap's namespaces."""
        return self in (Mode.BWRAP, Mode.BWRAP_DROP_UID)

    @property
    def drop_uid(self) -> bool:
        """Each program's process drops to the slot's unprivileged uid."""
        return self in (Mode.BWRAP_DROP_UID, Mode.RLIMITS_DROP_UID)

    @property
    def as_root(self) -> bool:
        """Programs run as root: only with the explicit opt-out."""
        return self is Mode.UNSAFE_ROOT


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
    # more host paths shown read-only; directories among them are also on the program's sys.path (the harness runs
    # with -I -S), so a site-packages with numpy there is importable by the program
    extra_ro_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.isolation not in get_args(Isolation):
            raise ValueError(f"sandbox isolation must be one of {get_args(Isolation)}, got {self.isolation!r}")
        for path in self.extra_ro_paths:
            real = os.path.realpath(path)
            if any(real == top or real.startswith(top + "/") for top in SANDBOX_TMPFS):
                raise ValueError(
                    f"extra_ro_paths: {path} is under {' or '.join(SANDBOX_TMPFS)}, which a bubblewrap sandbox "
                    "mounts empty for every program (its working directory and temporary files), so the path "
                    "would be hidden there; copy it somewhere else (e.g. under /opt) and give that path"
                )


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
