"""`Sandbox`: a pool of worker slots, each with one long-lived sandbox (started on first use, restarted when it
breaks or cannot clean up), running programs in parallel on a thread pool bounded by the usable cores."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from grpo_pipeline.rewards.sandbox import host
from grpo_pipeline.rewards.sandbox.config import CodeJob, Mode, RunResult, SandboxConfig
from grpo_pipeline.rewards.sandbox.supervise import StartError, Worker, run_program, start_worker, stop, stop_all

logger = logging.getLogger(__name__)

# A worker's sandbox that did not start is started again this many times in all (an infrastructure failure, e.g. a
# namespace or uid briefly unavailable under load, never the program's fault) before its program scores None.
START_ATTEMPTS = 3


class Sandbox:
    """Runs `CodeJob`s in isolated processes, in parallel. Thread-safe; one instance can serve many callers.

    Raises SandboxUnavailable (at construction, before any program runs) where it cannot isolate programs as
    `config.isolation` asks, e.g. as root without bubblewrap and without a usable unprivileged uid. `mode` says how
    programs are isolated here (config.Mode).
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = c = config or SandboxConfig()
        self.python, self.python_prefix = (c.python, host.python_prefix(c.python)) if c.python else host.base_python()
        self.workers = c.workers or host.usable_cores()
        self.mode: Mode = host.choose_mode(c, self.python, self.workers)
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")
        self._workers: list[Worker | None] = [None] * self.workers  # started on first use, restarted when broken
        self._lock = threading.Lock()
        self.start_failures = 0  # sandbox starts that failed (each retried up to START_ATTEMPTS in all)
        weakref.finalize(self, stop_all, self._workers)

    @property
    def isolated(self) -> bool:
        """Programs run inside bubblewrap's namespaces."""
        return self.mode.isolated

    @property
    def drop_uid(self) -> bool:
        """Each program drops to its slot's unprivileged uid (61000 + slot)."""
        return self.mode.drop_uid

    @property
    def as_root(self) -> bool:
        """Programs run as root (isolation="unsafe-root" only)."""
        return self.mode.as_root

    def run(self, jobs: Sequence[CodeJob]) -> list[RunResult]:
        """Run every job (in parallel, bounded by `workers`); results in the same order."""
        return list(self._pool.map(self._run_with_slot, jobs))

    def close(self) -> None:
        """Wait for running jobs, then stop every worker's sandbox."""
        self._pool.shutdown(wait=True)
        stop_all(self._workers)

    def _run_with_slot(self, job: CodeJob) -> RunResult:
        slot = self._slots.get()
        try:
            return self.run_one(job, slot)
        except Exception as e:  # a bug or an OS error on our side: never a silent 0
            logger.exception("sandbox infrastructure error")
            self._workers[slot] = stop(self._workers[slot])
            return RunResult(status="infra_error", detail=f"{type(e).__name__}: {e}")
        finally:
            self._slots.put(slot)

    def run_one(self, job: CodeJob, slot: int = 0) -> RunResult:
        """Run one job on slot `slot`'s worker (one caller per slot at a time; `run` hands out the slots)."""
        start = time.monotonic()
        worker = self._workers[slot]
        if worker is None or worker.proc.poll() is not None:
            stop(worker)
            try:
                worker = self._workers[slot] = self._start(slot)
            except StartError as e:
                self._workers[slot] = None
                logger.error("sandbox did not start after %d attempts: %s", START_ATTEMPTS, e)
                return RunResult(
                    status="infra_error",
                    detail="sandbox did not start",
                    output=str(e),
                    seconds=time.monotonic() - start,
                )
        result, server_died = run_program(self.config, worker, job, start)
        # Without bwrap the server kills what the program left (its descendants) and is replaced after every
        # program; with bwrap it is reused only when it also wiped the files and no process of the slot is left.
        clean = not server_died and worker.clean()
        if not (clean and self.mode.isolated):
            if not clean and not server_died:
                logger.warning("sandbox worker %d could not clean up after a program; restarting it", slot)
            self._workers[slot] = stop(worker)
        return result

    def _start(self, slot: int) -> Worker:
        """Slot `slot`'s worker, started again (after a short pause) when its start fails; every failure is counted
        in `start_failures` and logged. Raises the last StartError after START_ATTEMPTS failures."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return start_worker(self.config, self.mode, self.python, self.python_prefix, slot)
            except StartError as e:
                with self._lock:
                    self.start_failures += 1
                if attempt == START_ATTEMPTS:
                    raise
                logger.warning("sandbox worker %d did not start (%s); starting it again (attempt %d of %d)",
                               slot, str(e).strip()[-200:], attempt + 1, START_ATTEMPTS)  # fmt: skip
                time.sleep(0.1 * attempt)
        raise AssertionError("unreachable")


@functools.cache
def default_sandbox(config: SandboxConfig | None = None) -> Sandbox:
    """One shared sandbox per config, so rewards built many times reuse one worker pool."""
    return Sandbox(config or SandboxConfig())
