"""Process plumbing that the fork server (server.py), the tests' process (channel.py) and the program's stdin/stdout
launcher (stdio.py) share: a monotonic clock, closing every fd but some, waiting for a child by its pidfd.

Trusts: nothing; it acts on the calling process's own fds and children only. Imports nothing of this package.
"""

from __future__ import annotations

import os


def now() -> float:
    """Seconds of the monotonic clock (`time` is imported on first use, not at start-up)."""
    import time

    return time.monotonic()


def close_fds_except(keep: set[int]) -> None:
    """Close every fd of this process but those in `keep`."""
    low = 0
    for fd in [*sorted(keep), 1 << 20]:
        if low < fd:  # os.closerange(n, n) closes every fd on some Pythons (close_range with last = -1)
            os.closerange(low, fd)
        low = fd + 1


def wait_child(pid: int, deadline: float) -> int | None:
    """The wait status of child `pid` once it exits, woken by its pidfd (no polling; Linux 5.3+); None at the
    deadline. Raises ChildProcessError when `pid` is no child of this process (any more)."""
    import select
    import time

    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            wait = deadline - now()
            if wait <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], wait)
            else:
                time.sleep(0.0005)
    finally:
        if pidfd is not None:
            os.close(pidfd)
