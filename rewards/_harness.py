"""The sandbox harness: the first (and only trusted) code that runs inside a sandbox. Standard library only.

The host starts `python -I -S -c <this file> <config>` once per worker; it runs `serve`, a fork server that gets,
for each program, three fds over its control socket (SCM_RIGHTS):
  - spec fd (read): message 1 is the program, message 2 the tests and a nonce;
  - verdict fd (write): a "started" marker, then the result and its MAC (blake2b keyed with the nonce);
  - output fd: the program's stdout and stderr.

For each program the server forks a child (`run_program`), which closes every other fd, lowers its rlimits, drops
to an unprivileged uid when the server runs as root (and refuses to go on as root unless the host allowed it),
becomes non-dumpable, reads the program, forks, and only then reads the tests. The grandchild runs the program
and answers requests over its own pair of pipes (the call protocol, below); the child runs the tests in *its*
process, where the program's answers arrive as freshly decoded builtin and standard-library values or as handles.
For stdin/stdout tests the grandchild is instead a launcher that forks a fresh copy of the program per case and
hands back its stdout; it holds the inputs only. So the program never holds the tests, the expected values, the
nonce or the verdict fd, and nothing it does to its own process (sys.exit, atexit, SkipTest, an `__eq__` that is
always True, a redefined `check` or `set`, a tampered frame) can change the count of passed tests, which only the
child keeps.

Wire format: 4-byte big-endian length + a small tagged text encoding (`encode`/`decode`) that keeps builtin types
apart (tuple vs list, sets, int keys, exact floats) and carries standard-library values (Counter, deque, Decimal,
Fraction, datetime, namedtuples, enum members, ...) as their data, rebuilt as the library's own types on the other
side; anything else becomes a reference of the call protocol (a handle to a program's object, a callback to a
tests' callable), or, outside a call, an opaque value that equals nothing. It is parsed by hand, without `eval` or
pickle, and without importing json/re (start-up time matters here).

Contents, in the order of the section banners below:
  - wire format: framing (`read_message`, `write_message`), `encode`/`decode`;
  - standard-library values on the wire: how Counter, deque, Decimal, datetime, ... cross;
  - the call protocol: `send`/`receive`, the program's side (`serve_program`, `_ProgramSide`), and the stdin/stdout
    launcher (`_serve_stdio`, one fork per case);
  - the tests' side (this process): `Handle`, `Channel`, binding names into asserts (`_bind`);
  - stdout comparison rules: `outputs_match` and `STDOUT_RULES`, one per dataset's checker;
  - running the tests: `run_tests` (assert lists, call cases, stdio cases), the verdict's `mac`;
  - the fork server: `run_program` (one child per program: rlimits, uid, non-dumpable), `serve`.
"""

# ruff: noqa: SIM105  (try/except/pass, not contextlib.suppress: importing contextlib costs ~1 ms per sandbox start)
from __future__ import annotations

import builtins
import gc
import os
import sys

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

MAX_MESSAGE = 8 << 20  # bytes; a larger answer from the program counts as a failed call


# ---------------------------------------------------------------- wire format
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


def encode(x: object, depth: int = 0) -> str:
    """A compact text form of a value that keeps builtin types apart (tuple vs list, int keys, sets, exact floats).

    Scalars: N T F, i<int>; f<float.hex>; c<re>;<im>; b<hex>; s<len>:<chars>. Containers: l/t/S/z/I<n>: then n
    items (list, tuple, set, frozenset, materialised iterator), d<n>: then n key/value pairs, r<a>;<b>;<c>; a range.
    Standard-library values (Counter, deque, Decimal, datetime, ..., namedtuples, enum members: see `_carry`) are
    x<key><data>: a key string, then a tuple of data from which the decoder rebuilds a value of that type.
    A builtin type is y<len>:<name>. In a call, references: h<id>; a handle to an object of the program, k<id>; a
    callable of the tests, n<len>:<name> a name of the program (see `_ProgramSide`, `_TestsSide`). Anything else is
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
    elif (carried := _carry(x, t)) is not None:
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


class Opaque:
    """A value that could not be sent as builtin data; it equals nothing but itself."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = str(type_name)

    def __repr__(self) -> str:
        return f"<opaque {self.type_name}>"


class DecodeError(ValueError):
    pass


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
    """A standard-library value (x): its kind, then its constructor's arguments as a tuple."""
    key, pos = _decode(text, pos, depth + 1, namespace)
    data, pos = _decode(text, pos, depth + 1, namespace)
    if type(key) is not str or type(data) is not tuple:
        raise DecodeError("bad standard-library value")
    if key == "namedtuple":
        return _namedtuple(*data), pos
    if key == "enum":
        return _enum_member(namespace, *data), pos
    return _CARRIED[key][1](*data), pos


def to_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def from_bytes(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


# ---------------------------------------------------------------- standard-library values on the wire
# Tests compare answers with what an honest program returns, and that is often a standard-library value: an MBPP
# solution returns `Counter(s)` and its test compares it with a dict. Such a value crosses as its data only (builtin
# values), and the tests' process rebuilds a fresh value of the library's own type, whose __eq__ is the library's:
# nothing of the program (a subclass, a forged __eq__, a property, a default_factory) runs there. That guarantee is
# the decoder's: the encoder runs in the program's process, where a program can send any text anyway. The encoder's
# exact type checks keep a program's subclass of a library type opaque (its methods are not the library's), and it
# imports nothing: a value of a type whose module was never loaded cannot exist, so `sys.modules` is enough (start-up
# time matters: `decimal`, `fractions` and `datetime` cost ~2-5 ms each; the decoder imports them on first use).
def _carry(x: Any, t: type) -> tuple[str, tuple[Any, ...]] | None:
    """(key, data) when x crosses as a standard-library value, else None (x is then opaque)."""
    module, name = t.__module__, t.__name__
    key = f"{module}.{name}" if type(module) is str and type(name) is str else ""
    if key in _CARRIED and getattr(sys.modules.get(module), name, None) is t:  # exactly the library's class
        data = _CARRIED[key][0](x)
    elif (data := _namedtuple_data(x, t)) is not None:
        key = "namedtuple"
    elif (data := _enum_data(x, t)) is not None:
        key = "enum"
    return None if data is None else (key, data)


def _lib(name: str) -> Any:
    """A standard-library module, imported on first use (the decoder's side)."""
    return __import__(name)


def _exact(value: Any, *types: type) -> Any:
    """`value` when its type is exactly one of `types`, else DecodeError."""
    if type(value) not in types:
        raise DecodeError(f"expected {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}")
    return value


def _clock_data(x: Any, *fields: int) -> tuple[Any, ...] | None:
    """(fields..., tzinfo, fold) of a datetime.time or datetime.datetime; None (opaque) unless its tzinfo is None or
    a fixed-offset `datetime.timezone` (the offset of a program's tzinfo class would take running its methods)."""
    tz = x.tzinfo
    if tz is not None and type(tz) is not sys.modules["datetime"].timezone:
        return None
    return (*fields, tz, x.fold)


def _clock(name: str) -> Callable[..., Any]:
    """The decoder of datetime.time / datetime.datetime from `_clock_data`."""

    def build(*data: Any) -> Any:
        dt = _lib("datetime")
        *fields, tz, fold = data
        if tz is not None and type(tz) is not dt.timezone:
            raise DecodeError("tzinfo is not a fixed-offset timezone")
        return getattr(dt, name)(*(_exact(f, int) for f in fields), tzinfo=tz, fold=_exact(fold, int))

    return build


# default_factory values that cross (by name); any other factory (a lambda, a program's function) never runs on the
# tests' side: the defaultdict crosses without one (equal items, and a missing key raises KeyError there)
_FACTORIES = {f.__name__: f for f in (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset)}

# "module.Type": (its data, read in the program's process from a value of exactly that type, or None to leave it
# opaque; the value rebuilt from decoded data in the tests' process)
_CARRIED: dict[str, tuple[Callable[[Any], tuple[Any, ...] | None], Callable[..., Any]]] = {
    "builtins.bytearray": (lambda x: (bytes(x),), lambda b: bytearray(_exact(b, bytes))),
    "collections.Counter": (lambda x: (dict(x),), lambda d: _lib("collections").Counter(_exact(d, dict))),
    "collections.OrderedDict": (lambda x: (dict(x),), lambda d: _lib("collections").OrderedDict(_exact(d, dict))),
    "collections.defaultdict": (
        lambda x: (next((n for n, f in _FACTORIES.items() if f is x.default_factory), None), dict(x)),
        lambda f, d: _lib("collections").defaultdict(None if f is None else _FACTORIES[f], _exact(d, dict)),
    ),
    "collections.deque": (
        lambda x: (list(x), x.maxlen),
        lambda items, n: _lib("collections").deque(_exact(items, list), _exact(n, int, type(None))),
    ),
    "decimal.Decimal": (lambda x: (str(x),), lambda s: _lib("decimal").Decimal(_exact(s, str))),  # exact, NaN too
    "fractions.Fraction": (
        lambda x: (int(x.numerator), int(x.denominator)),
        lambda n, d: _lib("fractions").Fraction(_exact(n, int), _exact(d, int)),
    ),
    "datetime.timedelta": (
        lambda x: (x.days, x.seconds, x.microseconds),
        lambda *d: _lib("datetime").timedelta(*(_exact(v, int) for v in d)),
    ),
    "datetime.timezone": (  # (offset,) or (offset, name)
        lambda x: x.__getinitargs__(),
        lambda offset, *name: _lib("datetime").timezone(
            _exact(offset, _lib("datetime").timedelta), *(_exact(n, str) for n in name)
        ),
    ),
    "datetime.date": (
        lambda x: (x.year, x.month, x.day),
        lambda *d: _lib("datetime").date(*(_exact(v, int) for v in d)),
    ),
    "datetime.time": (lambda x: _clock_data(x, x.hour, x.minute, x.second, x.microsecond), _clock("time")),
    "datetime.datetime": (
        lambda x: _clock_data(x, x.year, x.month, x.day, x.hour, x.minute, x.second, x.microsecond),
        _clock("datetime"),
    ),
}


def _namedtuple_data(x: Any, t: type) -> tuple[Any, ...] | None:
    """(type name, field names, values) of a namedtuple, else None; read without calling any method of its class.

    Its class is the program's by nature, so it must be shaped exactly like what collections.namedtuple or
    typing.NamedTuple make (metaclass `type`, the only base `tuple`, a tuple of field names as `_fields` in its own
    dict: a `_fields` property is never called), and only its items cross, read with tuple's own methods. The tests'
    process rebuilds a namedtuple of that name and fields (`_namedtuple`): `==` with a tuple and attribute access
    work as in the original, and the class's own methods (a forged __eq__) stay behind.
    """
    if type(t) is not type:
        return None
    bases = t.__bases__
    if len(bases) != 1 or bases[0] is not tuple:
        return None
    fields = t.__dict__.get("_fields")
    values = tuple.__getitem__(x, slice(None))
    if not _namedtuple_ok(t.__name__, fields) or len(fields) != len(values):
        return None
    return t.__name__, fields, values


def _namedtuple_ok(typename: object, fields: object) -> bool:
    """Whether collections.namedtuple takes these names (it compiles the field names into its constructor)."""
    from keyword import iskeyword  # already loaded by collections

    def name_ok(name: object) -> bool:
        return type(name) is str and name.isidentifier() and not iskeyword(name)

    return (
        name_ok(typename)
        and type(fields) is tuple
        and len(fields) <= 1000
        and all(name_ok(f) and not f.startswith("_") for f in fields)
        and len(set(fields)) == len(fields)
    )


def _namedtuple(typename: str, fields: tuple[str, ...], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A namedtuple rebuilt from `_namedtuple_data`: an instance of a fresh class with that name and fields."""

    def make() -> Any:
        if not _namedtuple_ok(typename, fields):
            raise DecodeError("bad namedtuple names")
        return _lib("collections").namedtuple(typename, fields)

    cls = _rebuilt(("namedtuple", typename, fields), make)
    if type(values) is not tuple or len(values) != len(cls._fields):
        raise DecodeError("bad namedtuple values")
    return tuple.__new__(cls, values)


_ENUM_BASES = ("IntFlag", "Flag", "IntEnum", "StrEnum", "Enum")  # most specific first (StrEnum: Python 3.11+)


def _enum_data(x: Any, t: type) -> tuple[Any, ...] | None:
    """(module, qualified class name, base, member name, value, every (name, value)) of an enum member, else None.

    Its class is the program's by nature: only names and values cross, and the tests' process maps them to its own
    member of that enum (`_enum_member`). The member name is None for a combination of Flag members.
    """
    enum = sys.modules.get("enum")
    if enum is None or type(t) is not enum.EnumMeta:
        return None
    base = next(b for b in _ENUM_BASES if (c := getattr(enum, b, None)) is not None and issubclass(t, c))
    members = t.__members__
    name = x._name_ if members.get(x._name_) is x else None
    return t.__module__, t.__qualname__, base, name, x._value_, tuple((n, m._value_) for n, m in members.items())


def _enum_member(
    namespace: dict[str, Any] | None,
    module: str,
    qualname: str,
    base: str,
    name: str | None,
    value: Any,
    members: tuple[tuple[str, Any], ...],
) -> Any:
    """The member of the tests' own enum of that name, else of an equivalent enum rebuilt from the data; else Opaque.

    Enum members equal only themselves, so an honest `f() == Color.RED` (Color from the prompt or the test setup)
    needs the tests' own Color.RED; naming a member of the tests' enum is no forgery, as that is what an honest
    answer means. The enum is looked up in an already imported module (a standard-library enum such as
    http.HTTPStatus), then in `namespace`; elsewhere an enum of the same base, name and members is rebuilt, so that
    `.name`, `.value` and an IntEnum's `== 2` work as in the original. No method of the program's enum crosses.
    """
    import enum

    try:
        cls = _find_enum(enum, module, qualname, namespace)
        if cls is None:
            if base not in _ENUM_BASES or not _enum_members_ok(members):
                raise ValueError(f"not an enum's data: {base!r}")
            make = getattr(enum, base)  # the functional API: Enum("Color", [("RED", 1), ...])
            cls = _rebuilt(
                ("enum", module, qualname, base, members),
                lambda: make(qualname.rpartition(".")[2], list(members), module=module, qualname=qualname),
            )
        return cls(value) if name is None else cls.__members__[name]
    except (LookupError, ValueError, TypeError, AttributeError):  # not a member there, or data no enum accepts
        return Opaque(f"enum {qualname}")


def _enum_members_ok(members: object) -> bool:
    """Whether `members` is a tuple of (name, value) pairs whose names the enum makes members (a _sunder_ or
    __dunder__ name would instead set an attribute of the rebuilt class, such as _missing_)."""
    return (
        type(members) is tuple
        and len(members) <= 1000
        and all(
            type(m) is tuple and len(m) == 2 and type(m[0]) is str and not (m[0].startswith("_") and m[0].endswith("_"))
            for m in members
        )
    )


def _find_enum(enum: Any, module: str, qualname: str, namespace: dict[str, Any] | None) -> Any:
    """The enum class `qualname` of `module` if this process imported it, or of `namespace`; None if neither has it."""
    first, *rest = _exact(qualname, str).split(".")
    loaded = sys.modules.get(_exact(module, str))
    for scope in (getattr(loaded, "__dict__", None), namespace):
        found = scope.get(first) if type(scope) is dict else None
        for part in rest:  # a nested class: through classes only, never a module's or an object's __getattr__
            found = found.__dict__.get(part) if isinstance(found, type) else None
        if isinstance(found, enum.EnumMeta):
            return found
    return None


_REBUILT: dict[tuple[Any, ...], Any] = {}  # namedtuple and enum classes rebuilt in this process, by their data


def _rebuilt(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """The class rebuilt for `key`, made once per process so that answers of one type share a class (bounded)."""
    try:
        cls = _REBUILT.get(key)
    except TypeError:  # an unhashable enum value: a fresh class each time
        return make()
    if cls is None:
        cls = make()
        if len(_REBUILT) < 1024:
            _REBUILT[key] = cls
    return cls


# ---------------------------------------------------------------- the call protocol
# The tests call into the program as they would in one process, but every value that crosses is data or a reference:
#   - a program object that is not data (an instance of its class, a closure, a bound method, the class itself)
#     reaches the tests as a `Handle` (h<id>;): attribute reads, method calls, len/[]/in/iter/str on it go back to
#     the program's process; it equals only itself, so no method of the program decides an `==` in the tests;
#   - a callable of the tests (a lambda, a test's function or object) reaches the program as a `_Callback`
#     (k<id>;) that the program can only call: the call runs in the tests' process, on decoded arguments;
#   - a name of the program (n<len>:<name>) is looked up in the program's namespace there.
# Arguments the program mutates in place (list, dict, set, bytearray, nested) are copied back into the tests' own
# objects after the call, as the tests would see them in one process. Messages: a request is
# (op, target, args, kwargs); the answer ("v", value, mutated) or ("e", exception type name, message); while it
# waits for an answer, either side serves what the other asks first (a callback, or a call made inside one).
_REFS: Any = None  # this process's side of the protocol (`_ProgramSide` or `_TestsSide`); None: no references
_MUTABLE = (list, dict, set, bytearray)


def send(fd: int, value: object) -> None:
    write_message(fd, to_bytes(encode(value)))


def receive(fd: int, namespace: dict[str, Any] | None = None) -> Any:
    return decode(from_bytes(read_message(fd)), namespace)


class _Callback:
    """In the program: a callable of the tests; calling it asks the tests' process to call it (and waits)."""

    __slots__ = ("ref",)

    def __init__(self, ref: int) -> None:
        self.ref = ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        side = _REFS
        write_message(side.resp_fd, to_bytes(encode(("cb", self, args, kwargs))))
        while True:
            msg = receive(side.req_fd, side.namespace)
            if type(msg) is not tuple or not msg:
                raise RuntimeError("bad message from the tests")
            if msg[0] == "ret":
                return msg[1]
            if msg[0] == "raise":
                raise _exception(msg[1], msg[2])
            write_message(side.resp_fd, side.answer(msg))  # a call made by the callback itself

    def __repr__(self) -> str:
        return f"<callback {self.ref}>"


def _exception(kind: object, detail: object) -> BaseException:
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


class _ProgramSide:
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
                before = [(k, encode(v)) for k, v in [*enumerate(args), *kwargs.items()] if type(v) in _MUTABLE]
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


def serve_program(mode: str, program: str, req_fd: int, resp_fd: int, out_fd: int) -> None:
    """The program's process, in the mode the host sent with the program (at once, while the tests are read).
    Never returns.

    "load": run the program once, send the names it defines, then answer requests until the pipe closes.
    "stdio": run a fresh copy of the program for every input the tests send (`_serve_stdio`).
    """
    import signal

    # Python's default, which the harness side ignores: a SIGINT from the program must not raise KeyboardInterrupt
    # (a "broken test", scored None) in the process that runs the tests
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode == "stdio":
        _serve_stdio(program, req_fd, resp_fd, out_fd)
        os._exit(0)
    global _REFS
    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins, **_site_names()}
    _REFS = side = _ProgramSide(namespace, req_fd, resp_fd)
    try:
        exec(compile(program, "<solution>", "exec"), namespace)
        names = [
            k for k, v in list(namespace.items()) if type(k) is str and not k.startswith("__") and v is not sys.exit
        ]
        # functions and classes the tests may bind by name at once; other values need a request ("value")
        code_types = (type(_site_names), type)
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


def _site_names() -> dict[str, Any]:
    """`exit` and `quit`, which `site` would define (programs call them; the harness runs with -S)."""
    return {"exit": sys.exit, "quit": sys.exit}


def _serve_stdio(program: str, req_fd: int, resp_fd: int, out_fd: int) -> None:
    """For ("cases", inputs, seconds, max bytes): for each input, run a fresh copy of the program (a child of this
    process) with that input on stdin, and answer ("out", stdout, how it ended) as each ends (one message for all
    the inputs: a request per case would cost a wake-up of each side per case). This process holds the inputs
    only, never the expected outputs; the copies hold neither this process's pipes nor anything of the tests."""
    import resource

    try:
        code = compile(program, "<solution>", "exec")
        broken = ""
    except BaseException as e:  # every case fails with the reason
        code, broken = None, f"load error: {type(e).__name__}: {str(e)[:300]}"
    try:
        _, texts, seconds, max_bytes = receive(req_fd)
    except BaseException:
        return
    for text in texts:
        if code is None:
            send(resp_fd, ("out", "", broken))
            continue
        stdin = os.memfd_create("stdin")
        data = to_bytes(text)
        while data:
            data = data[os.write(stdin, data) :]
        os.lseek(stdin, 0, 0)
        out_r, out_w = os.pipe()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.dup2(stdin, 0)
                os.dup2(out_w, 1)
                os.dup2(out_fd, 2)
                _close_fds_except({0, 1, 2})
                cpu = resource.getrlimit(resource.RLIMIT_CPU)[1]
                limit = int(seconds) + 1 if cpu < 0 else min(cpu, int(seconds) + 1)
                resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))
                status = _run_main(code)
            finally:
                os._exit(status)
        os.close(out_w)
        os.close(stdin)
        send(resp_fd, ("out", *_collect(pid, out_r, _now() + seconds, max_bytes)))
        os.close(out_r)


def _run_main(code: Any) -> int:
    """Run a program as `python program.py` would, with this process's stdin and stdout; its exit status.

    After the main module ends (or raises, or calls sys.exit) comes the interpreter's own shutdown, in
    Py_FinalizeEx's order: wait for the program's non-daemon threads, run its atexit handlers, flush stdout. So an
    answer printed by a `Thread(target=main)` or an atexit handler counts, whatever the machine's load."""
    import atexit  # a builtin module: no import cost

    atexit._clear()  # handlers of this launcher's process are not the program's
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    out = sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    status = _run_module(lambda: exec(code, {"__name__": "__main__", "__builtins__": builtins, **_site_names()}))
    threading = sys.modules.get("threading")
    if threading is not None:  # only `threading` starts threads the interpreter waits for
        _run_module(threading._shutdown)
    atexit._run_exitfuncs()  # each handler's exception is printed and ignored, as at exit
    for stream in (sys.stdout, out):  # a program may have replaced sys.stdout; what it wrote to ours still counts
        try:
            if not stream.closed:
                stream.flush()
        except BaseException:
            return 120  # CPython's status when flushing stdout fails at exit
    return status


def _run_module(run: Callable[[], object]) -> int:
    """Run the main module (or the wait for its threads): 0, SystemExit's status, or 1 after printing the
    traceback of any other exception."""
    try:
        run()
    except SystemExit as e:
        return 0 if e.code is None else e.code if type(e.code) is int else 1
    except BaseException:
        import traceback  # only here: importing it costs more than running a small program

        traceback.print_exc()
        return 1
    return 0


def _collect(pid: int, out_r: int, deadline: float, max_bytes: int) -> tuple[str, str]:
    """Read a case's stdout until it closes and the process exits, or the deadline: (stdout, how it ended)."""
    import select

    chunks, size, ended = [], 0, ""
    while not ended:
        wait = deadline - _now()
        if wait <= 0:
            ended = "timeout"
        elif select.select([out_r], [], [], wait)[0]:
            chunk = os.read(out_r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                ended = "output_limit"
    if not ended:  # stdout closed: wait for the exit status
        status = _wait_child(pid, deadline)
        if status is not None:
            return b"".join(chunks).decode("utf-8", "replace"), f"exit {os.waitstatus_to_exitcode(status)}"
        ended = "timeout"
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except OSError:
        pass
    return "", ended


def _wait_child(pid: int, deadline: float) -> int | None:
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
            wait = deadline - _now()
            if wait <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], wait)
            else:
                time.sleep(0.0005)
    finally:
        if pidfd is not None:
            os.close(pidfd)


# ---------------------------------------------------------------- the tests' side (this process)
class CandidateFailure(Exception):
    """The program raised, died, answered garbage or ran out of time (a failed test, never a passed one)."""


class Handle:
    """Stands in for an object of the program inside the tests; every use of it is a request to the program.

    It equals only itself (the same object of the program), whatever the program's `__eq__` says.
    """

    __slots__ = ("_grpo_ref",)

    def __init__(self, ref: int) -> None:
        object.__setattr__(self, "_grpo_ref", ref)

    def _op(self, op: str, *args: Any) -> Any:
        return _REFS.channel.request(op, self, args, {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _REFS.channel.request("call", self, args, kwargs)

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


class _TestsSide:
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

        wait = deadline - _now()
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
            raise _exception(*[*answer[1:], "Error", ""][:2])
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
            answer = self._receive(_now() + seconds + 1.0)
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
            if type(a) in _MUTABLE and type(a) is type(b):
                _sync(a, b)
            else:
                old[i] = b
    elif t is dict:
        for k in [k for k in old if k not in new]:
            del old[k]
        for k, b in new.items():
            a = old.get(k)
            if type(a) in _MUTABLE and type(a) is type(b):
                _sync(a, b)
            else:
                old[k] = b
    elif t in (set, bytearray):
        if t is set:
            old.clear()
            old.update(new)
        else:
            old[:] = new


def _code_names(code: Any) -> set[str]:
    """Every global or attribute name a compiled statement uses, nested code (lambdas, comprehensions) included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


# builtins that `site` adds (the harness runs with -S): builtins of every normal Python all the same
_SITE_BUILTINS = ("copyright", "credits", "exit", "help", "license", "quit")


def _bind(names: list[str], needed: set[str], namespace: dict[str, Any], channel: Channel, protected: set[str]) -> None:
    """Bind the program's names the tests use into `namespace`: never a builtin or a protected name (a
    standard-library module the tests import, the harness's own), so a program cannot redefine `set`, `round` or
    `math` for its tests."""
    for name in names:
        if (
            name in needed
            and name not in protected
            and not hasattr(builtins, name)
            and name not in _SITE_BUILTINS
            and not name.startswith("_grpo")
        ):
            namespace[name] = channel.value(name)


class Units:
    """Pass/fail per test unit, kept in the harness process only."""

    def __init__(self, total: int) -> None:
        self.total, self.first_error = total, ""
        self.passed: set[int] = set()

    def ok(self, i: int) -> None:
        self.passed.add(i)

    def fail(self, i: int, error: BaseException | None = None) -> None:
        self.passed.discard(i)
        if error is not None and not self.first_error:
            self.first_error = f"test {i}: {_describe(error)}"


def _describe(error: BaseException) -> str:
    """`Type: message` of an exception, even one whose message cannot be read (an assert's message may be a handle
    to the program's object, whose __str__ runs there and may raise anything)."""
    try:
        return f"{type(error).__name__}: {str(error)[:300]}"
    except BaseException:
        return f"{type(error).__name__}: <unprintable>"


class TestsBroken(Exception):
    """The tests cannot be set up (they do not compile, their definitions raise, the rule is unknown): the
    dataset's or the host's fault, never the program's, so the row is unscored (an infrastructure error)."""


def _setup(what: str, step: Callable[[], Any]) -> Any:
    """`step()`, a part of setting up the tests that involves nothing of the program; TestsBroken if it raises."""
    try:
        return step()
    except BaseException as e:
        raise TestsBroken(f"{what}: {_describe(e)}") from None


# ---------------------------------------------------------------- stdout comparison rules
# Each stdin/stdout format's tests are judged as that dataset's own checker judges them (docs/rewards.md has the
# table, with the source of each): the host names the rule with the tests (`spec["stdout_rule"]`, set by the
# format in rewards/code_formats/). A rule sees only the program's stdout, as text: an exception while comparing
# (a `Decimal('sNaN')` compared, a number too large) is a wrong answer, never an unscored row.
def outputs_match(got: str, expected: str, rule: str = "lines", float_tolerance: float | None = None) -> bool:
    """Whether stdout `got` passes for `expected` under `rule` (a key of `STDOUT_RULES`), or, when a tolerance is
    given, because its numbers are within it (line by line, as "lines" reads lines)."""
    check = STDOUT_RULES[rule]  # an unknown rule is the host's error (an infrastructure error), not the program's
    try:
        if check(got, expected):
            return True
        return float_tolerance is not None and _within_tolerance(got, expected, float_tolerance)
    except Exception:
        return False


def _lines_match(got: str, expected: str) -> bool:
    """Line by line, trailing whitespace and trailing blank lines ignored (rows of no known dataset)."""
    return _lines(got) == _lines(expected)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _within_tolerance(got: str, expected: str, tolerance: float) -> bool:
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        xs, ys = x.split(), y.split()
        if len(xs) != len(ys):
            return False
        for u, v in zip(xs, ys, strict=True):
            if u != v and not _close(u, v, tolerance):
                return False
    return True


def _close(u: str, v: str, tolerance: float) -> bool:
    try:
        a, b = float(u), float(v)
    except ValueError:
        return False
    return abs(a - b) <= tolerance * max(1.0, abs(b))


def _livecodebench_match(got: str, expected: str) -> bool:
    """LiveCodeBench (`lcb_runner/evaluation/testing_util.py`, `grade_stdio`): both texts stripped and split into
    lines, each line stripped; as many lines; each line equal, or both lines' whitespace-split tokens all
    `Decimal`s and the two lists equal (`1.50` = `1.5`, `1  2` = `1 2`)."""
    a, b = _stripped_lines(got), _stripped_lines(expected)
    if len(a) != len(b):
        return False
    Decimal = _lib("decimal").Decimal  # imported only when a line differs (~2 ms)
    for x, y in zip(a, b, strict=True):
        if x != y and [Decimal(t) for t in x.split()] != [Decimal(t) for t in y.split()]:
            return False  # a token that is no Decimal raises: outputs_match makes that a wrong answer
    return True


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _apps_match(got: str, expected: str) -> bool:
    """APPS (`eval/testing_util.py`, `run_test`, stdin branch), its cascade in order on stdout's `splitlines()`:
    the whole text trimmed (as it is, or with every line stripped); the expected output's non-empty lines
    (stripped) against stdout's lines, then its non-empty lines; one number per line, `np.allclose` (rtol 1e-5,
    atol 1e-8); the set of each line's set of tokens (order and repeats ignored); the same with every token a float
    rounded to 3 places."""
    lines = got.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(line.strip() for line in lines).strip() == want:
        return True
    wanted = [line.strip() for line in expected.split("\n") if line]
    if lines == wanted:
        return True
    lines = [line for line in lines if line]
    if lines == wanted or _apps_numbers_close(lines, wanted):
        return True
    got_sets = {frozenset(line.split()) for line in lines if line.split()}
    wanted_sets = {frozenset(line.split()) for line in wanted}
    if got_sets == wanted_sets:
        return True
    try:
        rounded = {frozenset(round(float(t), 3) for t in s) for s in got_sets}
        return rounded == {frozenset(round(float(t), 3) for t in s) for s in wanted_sets}
    except (ValueError, OverflowError):
        return False


def _apps_numbers_close(lines: list[str], wanted: list[str]) -> bool:
    """APPS's `np.allclose` over one float per line (infinities equal only themselves, NaN nothing)."""
    try:
        a, b = [float(x) for x in lines], [float(y) for y in wanted]
    except ValueError:
        return False
    inf = float("inf")
    return len(a) == len(b) and all(
        x == y if inf in (abs(x), abs(y)) else abs(x - y) <= 1e-8 + 1e-5 * abs(y) for x, y in zip(a, b, strict=True)
    )


# absl::StrSplit on any of " \n\t\r\v", then absl::AsciiStrToLower: one translation table for both
_CODECONTESTS_FOLD = {**{ord(c): " " for c in "\n\t\r\v"}, **{c: c + 32 for c in range(ord("A"), ord("Z") + 1)}}


def _codecontests_match(got: str, expected: str) -> bool:
    """CodeContests (`execution/tester_sandboxer.cc`, `OutputsMatch`): tokens split on any of space, \\n, \\t,
    \\r, \\v (empty ones skipped), ASCII-lowercased; the lists equal, or as long and each pair equal, or both
    numbers (absl's SimpleAtod) within 1e-5 of each other."""
    a, b = _codecontests_tokens(got), _codecontests_tokens(expected)
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        u, v = _atod(x), _atod(y)
        if not (x == y if u is None or v is None else abs(u - v) < 1e-5):
            return False
    return True


def _codecontests_tokens(text: str) -> list[str]:
    return [t for t in text.translate(_CODECONTESTS_FOLD).split(" ") if t]


def _atod(token: str) -> float | None:
    """The token as absl::SimpleAtod reads it (decimal or exponent form, inf, nan; ASCII, no `_`), else None."""
    if not token.isascii() or "_" in token:  # Python's float() also reads `1_000` and non-ASCII digits
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _open_r1_match(got: str, expected: str) -> bool:
    """open-r1 (`src/open_r1/rewards.py`, `code_reward`'s script): stdout stripped and split into lines, each line
    stripped and compared with the expected output's line. open-r1 zips the two lists, so it ignores the lines past
    the shorter one (a program that prints only the first line of a longer answer passes there); here the line
    counts must match (the expected output's trailing blank lines aside), which passes nothing open-r1 fails."""
    out = got.strip().split("\n") if got.strip() else []
    want = expected.split("\n")
    while want and not want[-1].strip():
        want.pop()
    return len(out) == len(want) and all(x.strip() == y.strip() for x, y in zip(out, want, strict=True))


STDOUT_RULES: dict[str, Callable[[str, str], bool]] = {
    "lines": _lines_match,
    "livecodebench": _livecodebench_match,
    "apps": _apps_match,
    "codecontests": _codecontests_match,
    "open-r1": _open_r1_match,
}


# ---------------------------------------------------------------- running the tests
def run_tests(spec: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Run the tests against the program; returns the payload of the verdict.

    Whatever comes out of the program's objects while the tests run them (any exception, a BaseException, one whose
    message raises) fails the tests; only tests that cannot be set up (`TestsBroken`) leave the row unscored.
    """
    global _REFS
    result: dict[str, Any] = {
        "loaded": False,
        "passed": 0,
        "total": int(spec["total"]),
        "completed": False,
        "error": "",
        "timeout": False,
    }
    units = Units(result["total"])
    _REFS = _TestsSide(channel)
    try:
        if spec["kind"] == "stdio":
            result["loaded"] = True
            _run_stdio(spec, channel, units)
            result["completed"] = True
        else:
            names = channel.ready()
            result["loaded"] = True
            result["error"] = _run_calls(spec, channel, names, units)
            result["completed"] = result["error"] == ""
    except CandidateFailure as e:
        result["error"] = str(e)
    except TestsBroken:
        raise
    except BaseException as e:  # raised by the program's objects as the tests ran them: a failed test, never None
        result["error"] = _describe(e)
    result["passed"] = len(units.passed)
    result["error"] = result["error"] or units.first_error
    if result["total"] == 0:  # no assert at the top of `check`: the whole call is the one unit
        result["total"], result["passed"] = 1, int(result["completed"])
    result["timeout"] = channel.timed_out
    return result


def _run_stdio(spec: dict[str, Any], channel: Channel, units: Units) -> None:
    """stdin/stdout tests: one fresh run of the program per case."""
    seconds, max_bytes, tolerance = float(spec["case_timeout"]), int(spec["max_output"]), spec.get("float_tolerance")
    rule = spec.get("stdout_rule", "lines")
    _setup("the stdout rule", lambda: STDOUT_RULES[rule])
    outputs = channel.run_cases([text for text, _ in spec["cases"]], seconds, max_bytes)
    for i, ((out, ended), (_, expected)) in enumerate(zip(outputs, spec["cases"], strict=False)):
        if ended == "exit 0" and outputs_match(out, expected, rule, tolerance):
            units.ok(i)
        elif not units.first_error:
            units.first_error = f"test {i}: {ended}" + ("" if ended != "exit 0" else ": wrong output")


def _run_calls(spec: dict[str, Any], channel: Channel, names: list[str], units: Units) -> str:
    """Tests that call the program's functions: HumanEval `check`, assert lists, or call-based cases. Returns why
    they stopped short ("" when they ran to the end)."""
    namespace: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins, "_grpo_units_": units}
    channel.namespace = namespace
    for module in spec.get("imports", []):
        try:
            namespace[module] = __import__(module)
        except Exception:
            pass
    run = {"humaneval": _run_check, "calls": _run_call_cases, "asserts": _run_asserts}[spec["kind"]]
    return run(spec, channel, names, namespace, units)


def _run_check(spec: dict[str, Any], channel: Channel, names: list[str], namespace: dict[str, Any], _: Units) -> str:
    """HumanEval: the test's `check(candidate)`, its asserts counted as units by the host's rewrite."""
    if spec.get("setup"):  # the task's prompt: imports and helpers (e.g. `poly`) that tests use
        try:
            exec(compile(spec["setup"], "<prompt>", "exec"), namespace)
        except Exception:
            pass
    _setup("the test", lambda: exec(compile(spec["test"], "<test>", "exec"), namespace))
    check = _setup("the test", lambda: namespace["check"])
    entry = spec["entry_point"]
    if entry.isidentifier():  # the dataset names the function: the program's definition wins over the prompt's
        candidate = namespace[entry] = channel.value(entry) if entry in names else _missing(entry)
    else:
        code = _setup("the entry point", lambda: compile(entry, "<entry point>", "eval"))
        candidate = _entry(entry, code, names, namespace, channel, set(spec.get("imports", [])))
    try:
        check(candidate)
    except CandidateFailure:
        raise
    except Exception as e:
        return _describe(e)
    return ""


def _run_call_cases(
    spec: dict[str, Any], channel: Channel, names: list[str], namespace: dict[str, Any], units: Units
) -> str:
    """Call-based cases: the entry's answer compared with the expected value."""
    code = _setup("the entry point", lambda: compile(spec["entry_point"], "<entry point>", "eval"))
    protected = set(namespace)
    for i, (args, expected) in enumerate(spec["calls"]):
        try:
            got = _entry(spec["entry_point"], code, names, namespace, channel, protected)(*args)
            if type(got) is tuple:  # JSON has no tuples: the datasets' checkers compare them as lists
                got = list(got)
            if got == expected or (spec.get("unwrap") and type(expected) is list and [got] == expected):
                units.ok(i)
            elif not units.first_error:
                units.first_error = f"test {i}: wrong answer"
        except CandidateFailure:
            raise
        except Exception as e:
            units.fail(i, e)
    return ""


def _run_asserts(
    spec: dict[str, Any], channel: Channel, names: list[str], namespace: dict[str, Any], units: Units
) -> str:
    """Assert lists (MBPP): one unit per statement, each run on its own."""
    codes = _setup("the asserts", lambda: [compile(s, f"<test {i}>", "exec") for i, s in enumerate(spec["asserts"])])
    _bind(names, set().union(*map(_code_names, codes)), namespace, channel, set(namespace))
    for name in spec.get("under_test", ()):  # a function under test named like a builtin, where the asserts call it
        namespace[f"_grpo_under_test_{name}"] = channel.value(name) if name in names else getattr(builtins, name)
    for i, code in enumerate(codes):
        try:
            exec(code, namespace)
            units.ok(i)
        except CandidateFailure:
            raise
        except Exception as e:
            units.fail(i, e)
    return ""


def _entry(
    entry: str, code: Any, names: list[str], namespace: dict[str, Any], channel: Channel, protected: set[str]
) -> Any:
    """The entry point (`code`, compiled from `entry`): a function name, or an expression such as
    `Solution().twoSum` (LeetCode). A name is the function under test: the program's definition, even one named
    like a builtin (an APPS fn_name `sum`)."""
    if entry.isidentifier() and entry in names and entry not in protected:
        return channel.value(entry)
    scope = dict(namespace)
    _bind(names, _code_names(code), scope, channel, protected)
    return eval(code, scope)


def _missing(name: str) -> Callable[..., Any]:
    """Stands in for an entry point the program does not define: every call fails, as a NameError would."""

    def call(*args: Any, **kwargs: Any) -> Any:
        raise NameError(f"name {name!r} is not defined")

    return call


def mac(key: bytes, body: bytes) -> str:
    """blake2b keyed with the run's nonce (the builtin _blake2 module: no OpenSSL start-up cost)."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    return blake2b(body, key=key, digest_size=32).hexdigest()


def _now() -> float:
    import time

    return time.monotonic()


_LIBC: Any = None  # the C library, loaded once in the server (every child inherits it)


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _prctl(option: int, value: int) -> None:
    if _libc().prctl(option, value, 0, 0, 0) != 0:
        raise OSError(f"prctl({option}, {value}) failed")


def _prctl_not_dumpable() -> None:
    """Make this process non-dumpable: no ptrace, and its /proc memory, fds and environ belong to root."""
    _prctl(4, 0)  # PR_SET_DUMPABLE


def _become_sandbox_user(config: dict[str, Any]) -> None:
    """Drop to the slot's unprivileged uid (when the server runs as root) and stay non-dumpable.

    Raises PermissionError rather than go on as root, unless the host allowed it (isolation='unsafe-root'): a
    program running as root outside a pid namespace can kill every process on the machine with kill(-1).
    """
    uid = config.get("uid")
    if uid is not None and os.getuid() == 0:
        # A real unprivileged uid: RLIMIT_NPROC counts (it is ignored for root), and no capability survives.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if 0 in os.getresuid() and not config.get("allow_root"):
        raise PermissionError("the sandbox harness refuses to run a program as root (no unprivileged uid was given)")
    _prctl_not_dumpable()  # inherited over fork, and setuid may reset it (fs.suid_dumpable): set it again


def _close_fds_except(keep: set[int]) -> None:
    low = 0
    for fd in [*sorted(keep), 1 << 20]:
        if low < fd:  # os.closerange(n, n) closes every fd on some Pythons (close_range with last = -1)
            os.closerange(low, fd)
        low = fd + 1


def run_program(config: dict[str, Any], spec_fd: int, verdict_fd: int, out_fd: int) -> None:
    """One program, in a child of the server: rlimits, uid, fork the program, run the tests, write the verdict."""
    import resource

    start = _now()
    gc.disable()  # this process's objects form no cycles; a collection would only copy the server's pages
    # stdio becomes this run's output pipe, and every other fd of the server (its control socket) is closed; the
    # received fds are above 2, as the server's own stdio is open
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    _close_fds_except({0, 1, 2, spec_fd, verdict_fd})
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _become_sandbox_user(config)
    write_message(verdict_fd, b"started")
    message = from_bytes(read_message(spec_fd))  # the mode ("stdio" or "load"), a newline, the program
    mode, _, program = message.partition("\n")
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (spec_fd, verdict_fd, req_w, resp_r):
                os.close(fd)
            sys.path.extend(config.get("import_paths", ()))  # extra_ro_paths: the program's imports, not the tests'
            gc.enable()  # the program's process collects garbage as Python does
            serve_program(mode, program, req_r, resp_w, 2)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    spec = receive(spec_fd)  # the tests and the nonce arrive only now, after the program's process was forked
    os.close(spec_fd)
    channel = Channel(pid, req_w, resp_r, start + float(spec["timeout"]))
    try:
        payload = run_tests(spec, channel)
    except BaseException as e:  # tests that cannot be set up (not the program): an infrastructure error
        payload = {"infra_error": _describe(e)}
    channel.kill("done")
    body = to_bytes(encode(payload))
    write_message(verdict_fd, body)
    write_message(verdict_fd, mac(bytes.fromhex(spec["nonce"]), body).encode())
    if config.get("clean"):  # the fast path of the server's clean-up: no fork, done before the host asks
        for fd in (verdict_fd, 0, 1, 2):
            os.close(fd)
        _kill_all()
        deadline = start + float(spec["timeout"]) + 1.0
        _wait_child(pid, deadline)  # the program's process, woken when it is gone; then a check for any other
        _wait_until_others_exited(deadline)
        _wipe_all()


def _wait_until_others_exited(deadline: float) -> None:
    """Wait until every other process in the namespace but pid 1 has exited (is a zombie or gone)."""
    import time

    me = os.getpid()
    while True:
        alive = False
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, me):
                try:
                    with open(f"/proc/{name}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                alive = alive or state not in ("Z", "X")
        if not alive:
            return
        if _now() > deadline:
            raise OSError("processes are still running")
        time.sleep(0.0002)


# ---------------------------------------------------------------- the fork server
def serve(config: dict[str, Any]) -> None:
    """The long-lived server: pid 1 of the sandbox's pid namespace, Python and these modules already loaded.

    Control socket (SOCK_SEQPACKET) from the host: b"R" + three fds (spec, verdict, output) runs one program in a
    fresh child; b"C" makes sure every process but this one is gone and /work and /tmp are empty, and answers b"K"
    (clean) or b"D" (something is left: the host restarts the sandbox). The server never reads a program, a test or
    a nonce. With config["clean"] (only inside a pid namespace: kill(-1) must not reach the host's processes) the
    child cleans up itself after the verdict, and the server checks that it did.
    """
    import signal
    import socket

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    _prctl_not_dumpable()
    if not config.get("clean"):  # no pid namespace: what a program leaves is re-parented here, not to init
        _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    import resource  # noqa: F401  (loaded once here, not per program)

    _warm_up()
    ctl = socket.socket(fileno=config["control_fd"])
    ctl.sendall(b"U")
    runner = None
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 3)
        except OSError:
            os._exit(1)
        if not msg:  # the host closed the socket
            os._exit(0)
        if msg == b"R" and len(fds) == 3:
            runner = os.fork()
            if runner == 0:
                code = 1  # 0 only when run_program returned: the server's clean-up trusts it
                try:
                    run_program(config, *fds)
                    code = 0
                except BaseException:  # on the run's output pipe once run_program redirected it, else the log
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        elif msg == b"C":
            done = _clean(config, runner) if config.get("clean") else _kill_descendants(_now() + 2.0)
            ctl.sendall(b"K" if done else b"D")
            runner = None
        for fd in fds:
            os.close(fd)


def _warm_up() -> None:
    """Do once here what every program's processes would each do first, then fork: a process's first `compile`,
    text streams, MAC and wire message set up state lazily (the first `compile` alone costs ~2 ms of CPU in a
    freshly forked child, against ~0.1 ms once the parent has compiled), and a child inherits it ready. Then freeze
    the server's objects: no garbage collection in a child ever walks them, which would copy their pages."""
    compile("import sys\nprint(sum(map(int, sys.stdin.readline().split())))", "<warm-up>", "exec")
    decode(encode({"cases": [("1 2\n", "3\n")], "total": 1, "timeout": 1.5, "nonce": b"\x00".hex()}))
    mac(b"\x00" * 32, b"warm-up")
    with open(os.devnull, encoding="utf-8", errors="replace") as stdin, open(os.devnull, "w", encoding="utf-8") as out:
        out.write(stdin.read())
    import atexit  # noqa: F401
    import select  # noqa: F401

    gc.collect()
    gc.freeze()


def _in_child_as_sandbox_user(config: dict[str, Any], fn: Callable[[], object]) -> bool:
    """Run fn() in a child with the slot's uid; True when it returned normally."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _become_sandbox_user(config)
            fn()
            code = 0
        finally:
            os._exit(code)
    while True:
        try:
            return os.waitpid(pid, 0)[1] == 0
        except InterruptedError:
            continue


def _kill_all() -> None:
    if 0 in os.getresuid():  # as root, kill(-1) reaches every process of the machine unless a pid namespace holds it
        raise PermissionError("refusing kill(-1) as root")
    try:
        os.kill(-1, 9)  # every process this uid may signal in this pid namespace, except this one and pid 1
    except ProcessLookupError:
        pass


def _kill_descendants(deadline: float) -> bool:
    """Kill and reap every process below this server (a child subreaper); True when none is left.

    Outside a pid namespace, kill(-1) would reach processes that are not the program's (another sandbox's with the
    same uid, or, as root, the whole machine), so the server kills its own children, by pid, until none is left: a
    killed process's children are re-parented to it in turn. A pid cannot be reused before this server reaps it.
    """
    import time

    me = os.getpid()
    while True:
        for pid in _children_of(me):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                break
        if _now() > deadline:
            return False
        time.sleep(0.0005)


def _children_of(parent: int) -> list[int]:
    """Pids whose parent is `parent`, from /proc/<pid>/stat (the `children` file needs CONFIG_PROC_CHILDREN)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                found.append(int(name))
    return found


def _reap_all(deadline: float) -> bool:
    """Wait until this server (pid 1) has no child left, i.e. no other process exists in the namespace."""
    import time

    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if _now() > deadline:
                return False
            time.sleep(0.0005)


def _wipe(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
            _wipe(entry.path)
            os.rmdir(entry.path)
        else:
            os.unlink(entry.path)


def _wipe_all() -> None:
    for path in ("/work", "/tmp"):
        _wipe(path)
    for kind in ("shm", "sem", "msg"):  # System V IPC objects outlive processes: any left means a restart
        with open("/proc/sysvipc/" + kind) as f:
            if len(f.read().strip().splitlines()) > 1:
                raise OSError(f"System V {kind} objects left")


def _clean(config: dict[str, Any], runner: int | None) -> bool:
    """Kill everything the last program left, reap it, and wipe its files; False when that did not work."""
    deadline = _now() + 2.0
    # Fast path: the run's child killed everything, saw it exit and wiped the files (it exits 0 only then); after
    # 0.5 s it is stopped or stuck, and the slow path kills it.
    try:
        status = None if runner is None else _wait_child(runner, deadline - 1.5)
    except ChildProcessError:
        status = None
    if status == 0 and _reap_all(deadline):
        return True
    killed = _in_child_as_sandbox_user(config, _kill_all)
    return killed and _reap_all(deadline) and _in_child_as_sandbox_user(config, _wipe_all) and _reap_all(deadline)


def main() -> None:
    serve(decode(sys.argv[1]))


if __name__ == "__main__":
    main()
