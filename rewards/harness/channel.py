"""The call protocol, the tests' side: requests to the program's process (`Channel`), the program's objects inside
the tests (`Handle`), and how the tests' own objects cross (`TestsSide`: their callables as callbacks).

Every answer is decoded into fresh data, handles or the tests' own callables; a handle equals only itself (the same
object of the program), whatever the program's `__eq__` says. The program is called with a deadline: one that
times out, dies or answers anything malformed is killed, and the call raises CandidateFailure (a failed test, never
a passed one). Arguments the program mutated are copied back into the tests' own objects (`_sync`).

Trusts: nothing that the program's process sends. Imports: wire.py, calls.py (the protocol's shared pieces),
process.py (the clock).
"""

# ruff: noqa: SIM105  (try/except/pass, not contextlib.suppress: importing contextlib costs ~1 ms per sandbox start)
from __future__ import annotations

import os

from .calls import MUTABLE, CandidateFailure, as_exception
from .process import now
from .wire import DecodeError, receive, references, send

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any


class Handle:
    """Stands in for an object of the program inside the tests; every use of it is a request to the program.

    It equals only itself (the same object of the program), whatever the program's `__eq__` says.
    """

    __slots__ = ("_grpo_ref",)

    def __init__(self, ref: int) -> None:
        object.__setattr__(self, "_grpo_ref", ref)

    def _op(self, op: str, *args: Any) -> Any:
        return references().channel.request(op, self, args, {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return references().channel.request("call", self, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # protocol probes (copy, pickle, ...) stay here
            raise AttributeError(name)
        return self._op("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._op("setattr", name, value)

    def __delattr__(self, name: str) -> None:
        self._op("delattr", name)

    def __len__(self) -> int:
        return self._op("len")

    def __getitem__(self, key: Any) -> Any:
        return self._op("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._op("setitem", key, value)

    def __delitem__(self, key: Any) -> None:
        self._op("delitem", key)

    def __contains__(self, value: Any) -> bool:
        return bool(self._op("contains", value))

    def __iter__(self) -> Any:
        return iter(self._op("iter"))

    def __bool__(self) -> bool:
        return self._op("bool") is True

    def __str__(self) -> str:
        return str(self._op("str"))

    def __repr__(self) -> str:
        try:
            return str(self._op("repr"))
        except Exception:
            return f"<handle {self._grpo_ref}>"

    def __int__(self) -> int:
        return int(self._op("int"))

    def __float__(self) -> float:
        return float(self._op("float"))

    def __index__(self) -> int:
        return self._op("index").__index__()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._grpo_ref == self._grpo_ref

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._grpo_ref))


class _Name(Handle):
    """A function or class the program defines, by name: a handle that needs no request to make."""

    __slots__ = ()


class TestsSide:
    """The tests' process: how its objects cross (handles back to the program, callables as callbacks)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.callbacks: list[Any] = []

    def early(self, x: Any, t: type) -> str | None:
        if t is Handle:
            return f"h{x._grpo_ref};"
        if t is _Name:
            return f"n{len(x._grpo_ref)}:{x._grpo_ref}"
        return None

    def late(self, x: Any) -> str:
        self.callbacks.append(x)
        return f"k{len(self.callbacks) - 1};"

    def decode(self, tag: str, ref: Any) -> Any:
        if tag == "h":
            return Handle(ref)
        if tag == "k" and 0 <= ref < len(self.callbacks):
            return self.callbacks[ref]
        raise DecodeError(f"the program sent a reference of kind {tag!r} it cannot hold")


class Channel:
    """Requests to the program's process; every answer is decoded into fresh data, handles or the tests' own
    callables."""

    def __init__(self, pid: int, req_fd: int, resp_fd: int, deadline: float) -> None:
        self.pid, self.req_fd, self.resp_fd, self.deadline = pid, req_fd, resp_fd, deadline
        self.dead: str | None = None  # why the program can no longer be called
        self.timed_out = False
        self.namespace: dict[str, Any] | None = None  # the tests' globals, where answers' enum classes are looked up
        self.functions: set[str] = set()  # the program's functions and classes (by `ready`)

    def _receive(self, deadline: float | None = None) -> tuple[Any, ...]:
        """The next answer; callbacks the program makes while it works are served here first."""
        while True:
            answer = self._receive_one(self.deadline if deadline is None else min(deadline, self.deadline))
            if answer[0] != "cb":
                return answer
            self._callback(answer)

    def _receive_one(self, deadline: float) -> tuple[Any, ...]:
        import select

        wait = deadline - now()
        if wait <= 0 or not select.select([self.resp_fd], [], [], wait)[0]:
            self.timed_out = True
            self.kill("timeout")
            raise CandidateFailure("timeout")
        try:
            answer = receive(self.resp_fd, self.namespace)
            if type(answer) is not tuple or not answer or type(answer[0]) is not str:
                raise DecodeError("not a tagged tuple")
            return answer
        except Exception as e:
            self.kill(f"bad answer: {type(e).__name__}")
            raise CandidateFailure(self.dead) from None

    def _callback(self, message: tuple[Any, ...]) -> None:
        """Call one of the tests' callables for the program, and send it the result."""
        if len(message) != 4 or type(message[2]) is not tuple or type(message[3]) is not dict:
            self.kill("bad callback")
            raise CandidateFailure(self.dead)
        _, fn, args, kwargs = message
        try:
            reply: tuple[Any, ...] = ("ret", fn(*args, **kwargs))
        except CandidateFailure:
            raise
        except Exception as e:
            reply = ("raise", type(e).__name__, str(e)[:300])
        self._send(reply)

    def _send(self, message: tuple[Any, ...]) -> None:
        if self.dead is not None:
            raise CandidateFailure(self.dead)
        try:
            send(self.req_fd, message)
        except OSError:
            self.kill("program exited")
            raise CandidateFailure(self.dead) from None

    def kill(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass

    def ready(self) -> list[str]:
        """The names the program defines, or raise CandidateFailure if it did not load."""
        msg = self._receive()
        if msg[0] != "ready" or len(msg) != 3 or type(msg[1]) is not list or type(msg[2]) is not list:
            self.kill("load error: " + " ".join(str(m) for m in msg[1:])[:500])
            raise CandidateFailure(self.dead)
        self.functions = {n for n in msg[2] if type(n) is str}
        return [n for n in msg[1] if type(n) is str]

    def request(self, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._send((op, target, tuple(args), dict(kwargs)))
        answer = self._receive()
        if answer[0] != "v":
            raise as_exception(*[*answer[1:], "Error", ""][:2])
        if (
            len(answer) != 3
            or type(answer[2]) is not tuple
            or any(type(m) is not tuple or len(m) != 2 for m in answer[2])
        ):
            self.kill("bad answer")
            raise CandidateFailure(self.dead)
        for key, state in answer[2]:  # arguments the call mutated: the tests' own objects take the new contents
            if (type(key) is int and 0 <= key < len(args)) or (type(key) is str and key in kwargs):
                _sync(args[key] if type(key) is int else kwargs[key], state)
        return answer[1]

    def value(self, name: str) -> Any:
        """A name the program defines: a function or class by name, else its value as data or a handle."""
        if name in self.functions:
            return _Name(name)
        return self.request("value", _Name(name), (), {})

    def run_cases(self, texts: list[str], seconds: float, max_bytes: int) -> Iterator[tuple[str, str]]:
        """stdin/stdout cases, run one after another: (stdout, how it ended) for each, as each ends."""
        self._send(("cases", texts, seconds, max_bytes))
        for _ in texts:
            answer = self._receive(now() + seconds + 1.0)
            if answer[0] != "out" or len(answer) != 3 or type(answer[1]) is not str or type(answer[2]) is not str:
                self.kill("bad answer")
                raise CandidateFailure(self.dead)
            yield answer[1], answer[2]


def _sync(old: Any, new: Any) -> None:
    """Make the tests' object `old` hold what the program left in its copy `new` (same types), keeping the
    identity of nested lists, dicts and sets where the shape is unchanged."""
    t = type(old)
    if t is not type(new):
        return
    if t is list:
        if len(old) != len(new):
            old[:] = new
            return
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if type(a) in MUTABLE and type(a) is type(b):
                _sync(a, b)
            else:
                old[i] = b
    elif t is dict:
        for k in [k for k in old if k not in new]:
            del old[k]
        for k, b in new.items():
            a = old.get(k)
            if type(a) in MUTABLE and type(a) is type(b):
                _sync(a, b)
            else:
                old[k] = b
    elif t in (set, bytearray):
        if t is set:
            old.clear()
            old.update(new)
        else:
            old[:] = new
