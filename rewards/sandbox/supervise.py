"""One worker's sandbox and one program on it: starting the fork server, handing it a program's pipes, feeding the
program and its tests, reading the verdict (checked against the nonce) and the output within the time limit."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Any

from grpo_pipeline.rewards.harness import wire
from grpo_pipeline.rewards.harness.wire import DecodeError
from grpo_pipeline.rewards.sandbox.command import command_line, limits
from grpo_pipeline.rewards.sandbox.config import (
    BASE_UID,
    CLEAN_TIMEOUT_S,
    GRACE_S,
    OUTPUT_GRACE_S,
    START_TIMEOUT_S,
    CodeJob,
    Mode,
    RunResult,
    SandboxConfig,
)

logger = logging.getLogger(__name__)


class StartError(RuntimeError):
    """A worker's sandbox did not start (its log tail is the message): its programs score None."""


class Worker:
    """One long-lived sandbox: bwrap running the harness's fork server as pid 1 of its pid namespace."""

    def __init__(
        self, proc: subprocess.Popen[bytes], control: socket.socket, log: IO[bytes], workdir: str | None
    ) -> None:
        self.proc, self.control, self.log, self.workdir = proc, control, log, workdir

    def clean(self) -> bool:
        """Ask the server to kill what the last program left and wipe its files; False if it did not."""
        try:
            self.control.sendall(b"C")
            ready, _, _ = select.select([self.control], [], [], CLEAN_TIMEOUT_S)
            return bool(ready) and self.control.recv(16) == b"K"
        except OSError:
            return False

    def log_tail(self) -> str:
        try:
            self.log.seek(0)
            return self.log.read()[-2000:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""


def start_worker(c: SandboxConfig, mode: Mode, python: str, prefix: str, slot: int) -> Worker:
    """Start the fork server of slot `slot` and wait until it has loaded (its uid is 61000 + slot)."""
    host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # "clean": kill(-1) between programs, only where it cannot reach beyond this worker's pid namespace
    config: dict[str, Any] = {"control_fd": server_end.fileno(), "rlimits": limits(c), "clean": mode.isolated}
    # the harness runs with -I -S (no site-packages): the program's process appends these to its sys.path
    config["import_paths"] = [p for p in c.extra_ro_paths if os.path.isdir(p)]
    uid = BASE_UID + slot
    if mode.drop_uid:
        config["uid"] = uid
    if mode.as_root:  # otherwise the harness refuses to run a program as root (a second line of defence)
        config["allow_root"] = True
    workdir = None
    if not mode.isolated:
        workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
        if mode.drop_uid:
            os.chown(workdir, uid, uid)
    log = tempfile.TemporaryFile(prefix="grpo-sandbox-log-")  # noqa: SIM115 (the worker keeps it; stop closes it)
    config_r, config_w = os.pipe()
    try:
        proc = subprocess.Popen(
            command_line(c, mode, python, prefix),
            stdin=config_r,
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
        os.close(config_w)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        server_end.close()
        os.close(config_r)
    worker = Worker(proc, host_end, log, workdir)
    send_config(config_w, config)
    ready, _, _ = select.select([host_end], [], [], START_TIMEOUT_S)
    if not ready or host_end.recv(16) != b"U":
        stop(worker)
        raise StartError(worker.log_tail())
    return worker


def send_config(fd: int, config: dict[str, Any]) -> None:
    """Write the harness's config to `fd`, its stdin's other end, and close it (rewards/harness/server.py reads to
    the end): never on its command line, which every program in the sandbox could read."""
    data = wire.to_bytes(wire.encode(config))
    try:
        while data:
            data = data[os.write(fd, data) :]
    except BrokenPipeError:  # a harness that died at start: start_worker's wait for it reports that
        pass
    finally:
        os.close(fd)


@dataclass
class Collected:
    """What one program's run left on the pipes: its verdict bytes, its output, and why the host stopped it."""

    verdict: bytearray = field(default_factory=bytearray)
    output: bytearray = field(default_factory=bytearray)
    output_bytes: int = 0
    killed: str | None = None  # "timeout" or "output_limit"
    server_died: bool = False
    verdict_done: bool = False


def run_program(c: SandboxConfig, worker: Worker, job: CodeJob, start: float) -> tuple[RunResult, bool]:
    """Run `job` on `worker`: hand the server the program's three pipes, feed it and read what comes back;
    (result, whether the server died)."""
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
    # message 1: how the program runs (stdin/stdout cases, or loaded once and called) and the program itself;
    # message 2, read only after the program's process is forked: the tests and the nonce
    how = "stdio" if spec["kind"] == "stdio" else "load"
    pending = frame(wire.to_bytes(f"{how}\n{job.program}")) + frame(wire.to_bytes(wire.encode(spec)))
    try:
        got = collect(c, worker, pending, spec_w, verdict_r, out_r, start + c.timeout_s + GRACE_S)
    finally:
        for fd in (spec_w, verdict_r, out_r):
            os.close(fd)
    return judge(got, nonce, worker, time.monotonic() - start), got.server_died


def collect(
    c: SandboxConfig, worker: Worker, pending: bytes, spec_w: int, verdict_r: int, out_r: int, deadline: float
) -> Collected:
    """Write `pending` to the program's spec pipe, read its verdict and output pipes, until both close or
    `deadline`; stop early when the output passes `c.max_output_bytes`."""
    got = Collected()
    os.set_blocking(spec_w, False)
    with selectors.DefaultSelector() as sel:
        sel.register(spec_w, selectors.EVENT_WRITE, "spec")
        for fd, what in ((verdict_r, "verdict"), (out_r, "out"), (worker.control, "server")):
            sel.register(fd, selectors.EVENT_READ, what)
        readers = 2
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                # after the verdict, only a process the program left behind can hold the output pipe open
                got.killed = None if got.verdict_done else "timeout"
                break
            for key, _ in sel.select(timeout=left):
                if key.data == "spec":
                    with contextlib.suppress(BlockingIOError):
                        try:
                            pending = pending[os.write(spec_w, pending) :]
                        except BrokenPipeError:
                            pending = b""
                    if not pending:
                        sel.unregister(spec_w)
                elif key.data == "server":  # the server only speaks when asked: this is its socket closing
                    got.server_died = True
                    sel.unregister(worker.control)
                elif not (chunk := os.read(key.fd, 1 << 16)):
                    sel.unregister(key.fd)
                    readers -= 1
                    if key.data == "verdict":
                        got.verdict_done = True
                        deadline = min(deadline, time.monotonic() + OUTPUT_GRACE_S)
                elif key.data == "verdict":
                    got.verdict += chunk
                elif keep_output(c, got, chunk):
                    readers = 0
                    break
    return got


def keep_output(c: SandboxConfig, got: Collected, chunk: bytes) -> bool:
    """Keep up to `c.max_output_bytes` of the program's output; True (and `killed`) once it has written more."""
    got.output_bytes += len(chunk)
    if len(got.output) < c.max_output_bytes:
        got.output += chunk[: c.max_output_bytes - len(got.output)]
    if got.output_bytes > c.max_output_bytes:
        got.killed = "output_limit"
        return True
    return False


def judge(got: Collected, nonce: bytes, worker: Worker, seconds: float) -> RunResult:
    """The program's result: its verdict where the harness wrote a valid one; otherwise why there is none."""
    text = got.output.decode(errors="replace")
    result = parse_verdict(bytes(got.verdict), nonce)
    if result is not None:
        result.output, result.seconds = text, seconds
        if got.killed == "output_limit":  # a verdict was written, but the program flooded its output
            result.status = "output_limit"
        return result
    if got.server_died:  # not the program's doing: it cannot signal or trace the server (pid 1, another uid)
        logger.error("sandbox server died during a program: %s", worker.log_tail())
        return RunResult(status="infra_error", detail="the sandbox server died", output=text, seconds=seconds)
    if got.killed:
        return RunResult(status=got.killed, detail=f"killed: {got.killed}", output=text, seconds=seconds)
    if not got.verdict.startswith(frame(b"started")):
        logger.error("sandbox did not start a program: %s", text.strip()[-2000:])
        return RunResult(status="infra_error", detail="sandbox did not start", output=text, seconds=seconds)
    return RunResult(
        status="no_verdict", detail="the harness died before writing a verdict", output=text, seconds=seconds
    )


def stop(worker: Worker | None) -> None:
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


def stop_all(workers: list[Worker | None]) -> None:
    for i, worker in enumerate(workers):
        workers[i] = stop(worker)


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def parse_verdict(data: bytes, nonce: bytes) -> RunResult | None:
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
        if not secrets.compare_digest(wire.mac(nonce, body), mac):
            raise ValueError("bad MAC")
        payload = wire.decode(wire.from_bytes(body))
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
