"""Standard-library values on the wire: what crosses between the program and its tests besides builtin data.

Tests compare answers with what an honest program returns, and that is often a standard-library value: an MBPP
solution returns `Counter(s)` and its test compares it with a dict. Such a value crosses as its data only (builtin
values): `carry` reads (key, data) from it in the program's process, and `rebuild` makes a fresh value of the
library's own type from that data in the tests' process, whose __eq__ is the library's: nothing of the program (a
subclass, a forged __eq__, a property, a default_factory) runs there. Namedtuples and enum members, whose classes
are the program's by nature, cross as names and values only.

Trusts: nothing it rebuilds from. The guarantee is the decoder's (`rebuild`, through wire.py's `decode`): `carry`
runs in the program's process, where a program can send any text anyway, so `rebuild` checks the type of every
datum exactly (`_exact`) and calls only the standard library's constructors. The encoder's exact type checks keep a
program's subclass of a library type opaque (its methods are not the library's), and it imports nothing: a value
of a type whose module was never loaded cannot exist, so `sys.modules` is enough (start-up time matters:
`decimal`, `fractions` and `datetime` cost ~2-5 ms each; the decoder imports them on first use).

Also here, as every module of the wire needs them: `Opaque` (a value that could not cross as data) and
`DecodeError` (text that does not decode). Imports nothing of this package: it comes first in the harness.
"""

from __future__ import annotations

import sys

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Opaque:
    """A value that could not be sent as builtin data; it equals nothing but itself."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = str(type_name)

    def __repr__(self) -> str:
        return f"<opaque {self.type_name}>"


class DecodeError(ValueError):
    """Text that does not decode: malformed, or data that no value of its kind has."""


def carry(x: Any, t: type) -> tuple[str, tuple[Any, ...]] | None:
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


def rebuild(key: str, data: tuple[Any, ...], namespace: dict[str, Any] | None) -> Any:
    """A fresh value of the library's own type from `carry`'s (key, data), in the tests' process; raises on data that
    no such value has (wire.py's `decode` makes that a DecodeError).

    `namespace` (the tests' globals) is where an enum member's class is looked up by name.
    """
    if key == "namedtuple":
        return _namedtuple(*data)
    if key == "enum":
        return _enum_member(namespace, *data)
    return _CARRIED[key][1](*data)


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
