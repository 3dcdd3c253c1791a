"""The call protocol, and its program side: the process that runs the program and answers the tests' requests.

The tests call into the program as they would in one process, but every value that crosses is data or a reference:
  - a program object that is not data (an instance of its class, a closure, a bound method, the class itself)
    reaches the tests as a `Handle` (h<id>;): attribute reads, method calls, len/[]/in/iter/str on it go back to
    the program's process; it equals only itself, so no method of the program decides an `==` in the tests;
  - a callable of the tests (a lambda, a test's function or object) reaches the program as a `_Callback`
    (k<id>;) that the program can only call: the call runs in the tests' process, on decoded arguments;
  - a name of the program (n<len>:<name>) is looked up in the program's namespace there.
Arguments the program mutates in place (list, dict, set, bytearray, nested) are copied back into the tests' own
objects after the call, as the tests would see them in one process. Messages: a request is
(op, target, args, kwargs); the answer ("v", value, mutated) or ("e", exception type name, message); while it
waits for an answer, either side serves what the other asks first (a callback, or a call made inside one).

Here: `serve_program` (the program's process: "load" runs the program once and answers requests, "stdio" hands
over to the launcher in stdio.py) and `ProgramSide`; the tests' side is channel.py, which shares
`CandidateFailure`, `as_exception` and `MUTABLE` from here.

Trusts: nothing. The program runs in this process and can change anything in it, this module's code included
(even `encode`: it then sends crafted text, which the tests' side decodes into fresh data or refuses). Requests
can only do what `_OPS` lists to the program's objects. Imports: wire.py, stdio.py.
"""

from __future__ import annotations

import builtins
import os
import sys

from .stdio import as_script, program_namespace, serve_stdio
from .wire import DecodeError, encode, receive, references, send, to_bytes, use_references, write_message

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class CandidateFailure(Exception):
    """The program raised, died, answered garbage or ran out of time (a failed test, never a passed one)."""


MUTABLE = (list, dict, set, bytearray)


class _Callback:
    """In the program: a callable of the tests; calling it asks the tests' process to call it (and waits)."""

    __slots__ = ("ref",)

    def __init__(self, ref: int) -> None:
        self.ref = ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        side = references()
        write_message(side.resp_fd, to_bytes(encode(("cb", self, args, kwargs))))
        while True:
            msg = receive(side.req_fd, side.namespace)
            if type(msg) is not tuple or not msg:
                raise RuntimeError("bad message from the tests")
            if msg[0] == "ret":
                return msg[1]
            if msg[0] == "raise":
                raise as_exception(msg[1], msg[2])
            write_message(side.resp_fd, side.answer(msg))  # a call made by the callback itself

    def __repr__(self) -> str:
        return f"<callback {self.ref}>"


def as_exception(kind: object, detail: object) -> BaseException:
    """The builtin exception named `kind` (tests may expect e.g. ValueError), else a CandidateFailure."""
    exc = getattr(builtins, str(kind), None)
    if isinstance(exc, type) and issubclass(exc, Exception) and exc not in (StopIteration, StopAsyncIteration):
        try:
            return exc(str(detail))
        except Exception:  # one that takes other arguments (UnicodeDecodeError): the failure as it is
            pass
    return CandidateFailure(f"{kind}: {detail}")


# What a request can do to an object of the program (in the program's process); nothing else is ever run there.
_OPS: dict[str, Callable[..., Any]] = {
    "value": lambda o: o,
    "getattr": lambda o, name: getattr(o, name),
    "setattr": lambda o, name, v: setattr(o, name, v),
    "delattr": lambda o, name: delattr(o, name),
    "len": len,
    "getitem": lambda o, k: o[k],
    "setitem": lambda o, k, v: o.__setitem__(k, v),
    "delitem": lambda o, k: o.__delitem__(k),
    "contains": lambda o, v: v in o,
    "iter": iter,
    "bool": bool,
    "str": str,
    "repr": repr,
    "int": int,
    "float": float,
    "index": lambda o: o.__index__(),
}


class ProgramSide:
    """The program's process: its namespace, the objects it handed out as handles, and how it answers requests."""

    def __init__(self, namespace: dict[str, Any], req_fd: int, resp_fd: int) -> None:
        self.namespace, self.req_fd, self.resp_fd = namespace, req_fd, resp_fd
        self.handles: list[Any] = []

    def early(self, x: Any, t: type) -> str | None:
        return f"k{x.ref};" if t is _Callback else None

    def late(self, x: Any) -> str:
        self.handles.append(x)
        return f"h{len(self.handles) - 1};"

    def decode(self, tag: str, ref: Any) -> Any:
        if tag == "h":
            if not 0 <= ref < len(self.handles):
                raise DecodeError("unknown handle")
            return self.handles[ref]
        if tag == "k":
            return _Callback(ref)
        return self.namespace[ref]  # "n": a name of the program

    def answer(self, request: Any) -> bytes:
        """The encoded answer to one request (op, target, args, kwargs)."""
        try:
            op, target, args, kwargs = request
            if op == "call":
                before = [(k, encode(v)) for k, v in [*enumerate(args), *kwargs.items()] if type(v) in MUTABLE]
                value = target(*args, **kwargs)
                # arguments mutated in place go back with the answer (compared as encoded text: cheap and exact)
                changed = []
                for k, old in before:
                    now = args[k] if type(k) is int else kwargs[k]
                    if encode(now) != old:
                        changed.append((k, now))
                return to_bytes(encode(("v", value, tuple(changed))))
            return to_bytes(encode(("v", _OPS[op](target, *args), ())))
        except BaseException as e:
            try:
                return to_bytes(encode(("e", type(e).__name__, str(e)[:300])))
            except BaseException:
                return to_bytes(encode(("e", "Exception", "unprintable")))


def serve_program(mode: str, program: str, path: str, req_fd: int, resp_fd: int, out_fd: int) -> None:
    """The program's process, in the mode the host sent with the program (at once, while the tests are read);
    `path` is the program's file. Never returns.

    "load": run the program once, as module "solution" (as the datasets' judges import it: its `if __name__ ==
    "__main__":` block does not run) with `python prog.py`'s `sys.argv`, send the names it defines, then answer
    requests until the pipe closes.
    "stdio": run a fresh copy of the program for every input the tests send (`serve_stdio`).
    """
    import signal

    # Python's default, which the harness side ignores: a SIGINT from the program must not raise KeyboardInterrupt
    # (a "broken test", scored None) in the process that runs the tests
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode == "stdio":
        serve_stdio(program, path, req_fd, resp_fd, out_fd)
        os._exit(0)
    namespace = program_namespace("solution", path)
    side = ProgramSide(namespace, req_fd, resp_fd)
    use_references(side)
    as_script(path)
    try:
        exec(compile(program, path, "exec"), namespace)
        names = [
            k for k, v in list(namespace.items()) if type(k) is str and not k.startswith("__") and v is not sys.exit
        ]
        # functions and classes the tests may bind by name at once; other values need a request ("value")
        code_types = (type(as_script), type)
        send(resp_fd, ("ready", names, [k for k in names if type(namespace[k]) in code_types]))
    except BaseException as e:  # SystemExit, SkipTest, ... at import time: the program did not load
        send(resp_fd, ("load_error", type(e).__name__, str(e)[:500]))
        os._exit(0)
    while True:
        try:
            request = receive(req_fd, namespace)  # the tests' enum members become the program's
        except BaseException:
            os._exit(0)
        write_message(resp_fd, side.answer(request))
