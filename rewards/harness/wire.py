"""The wire: messages between the harness's processes (and the host), and the text encoding of values.

Framing: 4-byte big-endian length + data (`read_message`, `write_message`; `send`/`receive` for encoded values); a
message over MAX_MESSAGE is refused. The verdict's MAC (`mac`: blake2b keyed with the run's nonce) is what the host
checks before it believes a verdict.

Encoding (`encode`/`decode`): a small tagged text that keeps builtin types apart (tuple vs list, sets, int keys,
exact floats) and carries standard-library values (Counter, deque, Decimal, Fraction, datetime, namedtuples, enum
members, ...: values.py) as their data, rebuilt as the library's own types on the other side; anything else becomes
a reference of the call protocol (a handle to a program's object, a callback to a tests' callable: calls.py and
channel.py), or, outside a call, an opaque value that equals nothing. Which references a process sends and accepts
is its side of the protocol, set once per process (`use_references`). The text is parsed by hand, without `eval`
or pickle, and without importing json/re (start-up time matters here).

Trusts: nothing it decodes. `decode` makes fresh builtin and standard-library objects (or the references its
process's side hands out) and raises DecodeError on anything malformed. The host uses this module too
(rewards/sandbox/: the server's config, each program's spec, the verdict and its MAC).
Imports: values.py.
"""

from __future__ import annotations

import builtins
import os

from .values import DecodeError, Opaque, carry, rebuild

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


MAX_MESSAGE = 8 << 20  # bytes; a larger answer from the program counts as a failed call


def read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> bytes:
    n = int.from_bytes(read_exact(fd, 4), "big")
    if n > MAX_MESSAGE:
        raise ValueError(f"message of {n} bytes is over the limit")
    return read_exact(fd, n)


def write_message(fd: int, data: bytes) -> None:
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def to_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def from_bytes(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def send(fd: int, value: object) -> None:
    write_message(fd, to_bytes(encode(value)))


def receive(fd: int, namespace: dict[str, Any] | None = None) -> Any:
    return decode(from_bytes(read_message(fd)), namespace)


def mac(key: bytes, body: bytes) -> str:
    """blake2b keyed with the run's nonce (the builtin _blake2 module: no OpenSSL start-up cost)."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    return blake2b(body, key=key, digest_size=32).hexdigest()


_REFS: Any = None  # this process's side of the call protocol (calls.ProgramSide or channel.TestsSide); None: none


def use_references(side: Any) -> None:
    """Make `side` this process's side of the call protocol: which references `encode` sends and `decode` accepts."""
    global _REFS
    _REFS = side


def references() -> Any:
    """This process's side of the call protocol (None: no references cross)."""
    return _REFS


def encode(x: object, depth: int = 0) -> str:
    """A compact text form of a value that keeps builtin types apart (tuple vs list, int keys, sets, exact floats).

    Scalars: N T F, i<int>; f<float.hex>; c<re>;<im>; b<hex>; s<len>:<chars>. Containers: l/t/S/z/I<n>: then n
    items (list, tuple, set, frozenset, materialised iterator), d<n>: then n key/value pairs, r<a>;<b>;<c>; a range.
    Standard-library values (Counter, deque, Decimal, datetime, ..., namedtuples, enum members: values.py) are
    x<key><data>: a key string, then a tuple of data from which the decoder rebuilds a value of that type.
    A builtin type is y<len>:<name>. In a call, references: h<id>; a handle to an object of the program, k<id>; a
    callable of the tests, n<len>:<name> a name of the program (calls.py, channel.py). Anything else is
    o<len>:<type name>, an opaque value.
    """
    out: list[str] = []
    _encode(x, out, depth)
    return "".join(out)


def _encode(x: Any, out: list[str], depth: int) -> None:
    t = type(x)
    if x is None:
        out.append("N")
    elif t is bool:
        out.append("T" if x else "F")
    elif t is int:
        out.append(f"i{x};")
    elif t is float:
        out.append(f"f{x.hex()};")
    elif t is str:
        out.append(f"s{len(x)}:")
        out.append(x)
    elif depth > 100:
        out.append("o8:too deep")
    elif t in _CONTAINER_TAGS:
        out.append(f"{_CONTAINER_TAGS[t]}{len(x)}:")
        for v in x:
            _encode(v, out, depth + 1)
    elif t is dict:
        out.append(f"d{len(x)}:")
        for k, v in x.items():
            _encode(k, out, depth + 1)
            _encode(v, out, depth + 1)
    elif t is bytes:
        out.append(f"b{x.hex()};")
    elif t is complex:
        out.append(f"c{x.real.hex()};{x.imag.hex()};")
    elif t is range:
        out.append(f"r{x.start};{x.stop};{x.step};")
    elif _REFS is not None and (ref := _REFS.early(x, t)) is not None:  # a reference of the call protocol
        out.append(ref)
    elif t is type and getattr(builtins, x.__name__, None) is x:  # a builtin type (`int`, `ValueError`), by name
        out.append(f"y{len(x.__name__)}:{x.__name__}")
    elif (carried := carry(x, t)) is not None:
        out.append("x")
        _encode(carried[0], out, depth + 1)
        _encode(carried[1], out, depth + 1)
    elif hasattr(t, "__next__") and hasattr(t, "__iter__"):  # generators, map, zip, ...: materialise (bounded)
        items: list[object] = []
        for v in x:
            items.append(v)
            if len(items) > 100000:
                break
        out.append(f"I{len(items)}:")
        for v in items:
            _encode(v, out, depth + 1)
    elif t.__module__ == "numpy" and hasattr(x, "tolist"):  # numpy scalars/arrays from honest programs
        _encode(x.tolist(), out, depth + 1)
    elif _REFS is not None and (ref := _REFS.late(x)) is not None:  # any other object: a handle or a callback
        out.append(ref)
    else:
        name = t.__name__ if isinstance(t.__name__, str) else "?"
        out.append(f"o{len(name)}:{name}")


_CONTAINER_TAGS = {list: "l", tuple: "t", set: "S", frozenset: "z"}


def decode(text: str, namespace: dict[str, Any] | None = None) -> Any:
    """Fresh objects (builtin and standard-library types only) from `encode`'s text; malformed input raises DecodeError.

    `namespace` (the tests' globals, on the tests' side) is where an enum member's class is looked up by name.
    """
    try:
        value, pos = _decode(text, 0, 0, namespace)
    except (LookupError, ValueError, TypeError, ArithmeticError, RecursionError) as e:
        raise DecodeError(f"{type(e).__name__}: {e}") from None
    if pos != len(text):
        raise DecodeError("trailing data")
    return value


def _upto(text: str, pos: int, sep: str) -> tuple[str, int]:
    end = text.index(sep, pos)
    return text[pos:end], end + 1


def _decode(text: str, pos: int, depth: int, namespace: dict[str, Any] | None) -> tuple[Any, int]:
    if depth > 200:
        raise DecodeError("too deep")
    tag = text[pos]
    pos += 1
    if tag in _CONSTANTS:
        return _CONSTANTS[tag], pos
    if tag == "i":
        raw, pos = _upto(text, pos, ";")
        return int(raw), pos
    if tag == "f":
        raw, pos = _upto(text, pos, ";")
        return float.fromhex(raw), pos
    if tag in "soyn":
        return _decode_text(tag, text, pos)
    if tag in "hk":
        raw, pos = _upto(text, pos, ";")
        if _REFS is None:
            raise DecodeError("a reference outside a call")
        return _REFS.decode(tag, int(raw)), pos
    if tag in "ltSzId":
        return _decode_container(tag, text, pos, depth, namespace)
    if tag == "b":
        raw, pos = _upto(text, pos, ";")
        return bytes.fromhex(raw), pos
    if tag == "c":
        re_, pos = _upto(text, pos, ";")
        im, pos = _upto(text, pos, ";")
        return complex(float.fromhex(re_), float.fromhex(im)), pos
    if tag == "r":
        a, pos = _upto(text, pos, ";")
        b, pos = _upto(text, pos, ";")
        c, pos = _upto(text, pos, ";")
        return range(int(a), int(b), int(c)), pos
    if tag == "x":
        return _decode_carried(text, pos, depth, namespace)
    raise DecodeError(f"unknown tag {tag!r}")


_CONSTANTS: dict[str, Any] = {"N": None, "T": True, "F": False}


def _decode_text(tag: str, text: str, pos: int) -> tuple[Any, int]:
    """A length-prefixed text: a string (s), an opaque object's repr (o), a builtin type (y) or a name reference (n)."""
    raw, pos = _upto(text, pos, ":")
    n = int(raw)
    if n < 0 or pos + n > len(text):
        raise DecodeError("bad length")
    s = text[pos : pos + n]
    if tag == "y":
        found = getattr(builtins, s, None)
        if type(found) is not type or s.startswith("_"):
            raise DecodeError(f"not a builtin type: {s!r}")
        return found, pos + n
    if tag == "n":
        if _REFS is None:
            raise DecodeError("a name reference outside a call")
        return _REFS.decode(tag, s), pos + n
    return (s if tag == "s" else Opaque(s)), pos + n


def _decode_container(tag: str, text: str, pos: int, depth: int, namespace: dict[str, Any] | None) -> tuple[Any, int]:
    """A list (l), tuple (t), set (S), frozenset (z), iterator (I) or dict (d) of counted items."""
    raw, pos = _upto(text, pos, ":")
    n = int(raw)
    if n < 0 or n > len(text):
        raise DecodeError("bad length")
    items: list[Any] = []
    for _ in range(2 * n if tag == "d" else n):
        v, pos = _decode(text, pos, depth + 1, namespace)
        items.append(v)
    if tag == "l":
        return items, pos
    if tag == "t":
        return tuple(items), pos
    if tag == "S":
        return set(items), pos
    if tag == "z":
        return frozenset(items), pos
    if tag == "I":
        return iter(items), pos
    return dict(zip(items[0::2], items[1::2], strict=True)), pos


def _decode_carried(text: str, pos: int, depth: int, namespace: dict[str, Any] | None) -> tuple[Any, int]:
    """A standard-library value (x): its kind, then its constructor's arguments as a tuple (values.py rebuilds it)."""
    key, pos = _decode(text, pos, depth + 1, namespace)
    data, pos = _decode(text, pos, depth + 1, namespace)
    if type(key) is not str or type(data) is not tuple:
        raise DecodeError("bad standard-library value")
    return rebuild(key, data, namespace), pos
