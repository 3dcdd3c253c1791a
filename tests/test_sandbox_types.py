"""Standard-library values on the sandbox's wire: honest programs that return them pass, forged ones still score 0.

The tests' process rebuilds a Counter, deque, Decimal, datetime, namedtuple, enum member, ... from its data alone
(rewards/harness/values.py, `carry`); a program's own class or subclass stays an opaque value that equals nothing. The
unit tests check the wire format in this process; the `integration` tests start real sandboxes (see
tests/test_sandbox.py for how they pick one, and skip where none can run programs).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import decimal
import enum
import fractions
import random
import subprocess
import sys
import textwrap
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from grpo_pipeline.rewards import harness
from grpo_pipeline.rewards.code import asserts_job, humaneval_job
from grpo_pipeline.rewards.harness.wire import DecodeError, Opaque, decode, encode
from grpo_pipeline.rewards.registry import build_reward
from grpo_pipeline.rewards.sandbox import RunResult, Sandbox
from tests.test_sandbox import TIMEOUT_S, make_sandbox, require_containment, run_program

Point = collections.namedtuple("Point", "x y")


class Span(typing.NamedTuple):
    start: int
    end: int = 0


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.IntFlag):
    R = 4
    W = 2


class Mode(enum.Flag):
    A = 1
    B = 2


class Unit(enum.StrEnum):
    CM = "cm"


IST = dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")

ROUND_TRIPS = {
    "Counter": collections.Counter({"b": 2, "a": 1, "z": 0, "n": -3}),
    "OrderedDict": collections.OrderedDict([("b", 1), ("a", (2, 3))]),
    "defaultdict(list)": collections.defaultdict(list, {"a": [1], 2: []}),
    "deque": collections.deque([1, "2", (3,)]),
    "deque(maxlen)": collections.deque(range(5), maxlen=3),
    "namedtuple": Point(1, [2.5]),
    "typing.NamedTuple": Span(3),
    "Decimal": decimal.Decimal("1.2300"),
    "Decimal(-0)": decimal.Decimal("-0"),
    "Decimal(1E+5)": decimal.Decimal("1E+5"),
    "Decimal(-Infinity)": decimal.Decimal("-Infinity"),
    "Fraction": fractions.Fraction(-22, 7),
    "date": dt.date(2024, 2, 29),
    "time": dt.time(23, 59, 58, 999999),
    "time(tz, fold)": dt.time(1, 30, tzinfo=dt.UTC, fold=1),
    "datetime": dt.datetime(2024, 1, 31, 12, 0, 1, 5),
    "datetime(IST)": dt.datetime(2024, 1, 31, 12, tzinfo=IST),
    "timedelta": dt.timedelta(days=-1, seconds=5, microseconds=7),
    "timezone": IST,
    "Enum": Color.RED,
    "IntEnum": Level.HIGH,
    "IntFlag": Perm.R | Perm.W,
    "Flag": Mode.B,
    "StrEnum": Unit.CM,
    "bytearray": bytearray(b"\x00hi"),
    "bytes": b"\xff",
    "complex": -1.5 + 0j,
    "frozenset": frozenset({1, "a"}),
    "nested": {"when": [dt.date(2024, 1, 1)], "counts": collections.Counter("aab"), Color.GREEN: Point(0, 0)},
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_library_values_round_trip(name: str) -> None:
    value = ROUND_TRIPS[name]
    decoded = decode(encode(value))
    assert decoded == value and repr(decoded) == repr(value)
    if isinstance(value, tuple) and type(value) is not tuple:  # a namedtuple: a fresh class, same name and fields
        assert type(decoded).__name__ == type(value).__name__ and decoded._fields == value._fields
    else:
        assert type(decoded) is type(value)
    if isinstance(value, collections.defaultdict):
        assert decoded.default_factory is value.default_factory
    if isinstance(value, dict):
        assert list(decoded.items()) == list(value.items())  # order, too
    if isinstance(value, dt.datetime | dt.time):
        assert decoded.tzinfo == value.tzinfo and decoded.fold == value.fold


def test_decimal_nan_crosses_exactly() -> None:
    for text in ("NaN", "-sNaN12", "0E-7"):
        assert str(decode(encode(decimal.Decimal(text)))) == text


def test_namedtuple_behaves_like_the_original() -> None:
    decoded = decode(encode(Point(1, 2)))
    assert decoded == (1, 2) and decoded == Point(1, 2) and decoded.x == 1 and decoded._asdict() == {"x": 1, "y": 2}
    assert type(decode(encode(Point(3, 4)))) is type(decoded)  # one rebuilt class per name and fields
    assert decode(encode(Span(1, 2))).end == 2


def test_defaultdict_keeps_builtin_factories_only() -> None:
    assert decode(encode(collections.defaultdict(int))).default_factory is int
    made = collections.defaultdict(lambda: 7, {"a": 1})
    decoded = decode(encode(made))
    assert decoded == {"a": 1} and decoded.default_factory is None  # a program's factory never runs on the tests' side


class TestEnumMembers:
    """An enum member means a member of the tests' own enum of that name; else of an equivalent rebuilt enum."""

    def test_member_of_an_imported_module_is_that_member(self) -> None:
        assert decode(encode(Color.RED)) is Color.RED
        assert decode(encode(Perm.R | Perm.W)) is Perm.R | Perm.W

    def test_member_of_the_tests_namespace(self) -> None:
        program_color = enum.Enum("Color", [("RED", 1), ("GREEN", 2)], module="solution")
        text = encode(program_color.GREEN)
        assert decode(text, {"Color": Color}) is Color.GREEN
        assert decode(text, {"Color": Color}) != program_color.GREEN

    def test_rebuilt_where_the_tests_do_not_define_it(self) -> None:
        program_level = enum.IntEnum("Level", [("LOW", 1), ("HIGH", 2)], module="solution")
        text = encode(program_level.HIGH)
        for namespace in (None, {"Level": lambda: 0}):  # not there, or not an enum there (e.g. a proxy)
            rebuilt = decode(text, namespace)
            assert rebuilt == 2 and rebuilt.name == "HIGH" and rebuilt.value == 2 and type(rebuilt).__name__ == "Level"
        assert decode(text) is decode(text)  # one rebuilt class: equal answers stay equal
        assert decode(encode(program_level.LOW)) < decode(text)

    def test_a_member_the_tests_enum_lacks_is_opaque(self) -> None:
        program_color = enum.Enum("Color", [("RED", 1), ("PURPLE", 9)], module="solution")
        assert isinstance(decode(encode(program_color.PURPLE), {"Color": Color}), Opaque)

    def test_a_program_enum_with_a_forged_eq_loses_it(self) -> None:
        class Forged(enum.Enum):
            X = 1

            def __eq__(self, other: object) -> bool:
                return True

            __hash__ = enum.Enum.__hash__

        Forged.__module__ = "solution"  # as a program's enum is, on the tests' side
        decoded = decode(encode(Forged.X))
        assert decoded != 4 and decoded != 1 and decoded.name == "X" and decoded.value == 1


# ---------------------------------------------------------------- what stays opaque
class ForgedCounter(collections.Counter):
    def __eq__(self, other: object) -> bool:
        return True


class ForgedTuple(tuple):
    def __eq__(self, other: object) -> bool:
        return True


class NamedtupleSubclass(Point):
    __slots__ = ()


SUBCLASSES = {
    "Counter": ForgedCounter("ab"),
    "OrderedDict": type("OD", (collections.OrderedDict,), {})(),
    "defaultdict": type("DD", (collections.defaultdict,), {})(int),
    "deque": type("DQ", (collections.deque,), {})(),
    "Decimal": type("D", (decimal.Decimal,), {})("1"),
    "Fraction": type("F", (fractions.Fraction,), {})(1, 2),
    "date": type("Date", (dt.date,), {})(2024, 1, 1),
    "datetime": type("DT", (dt.datetime,), {})(2024, 1, 1),
    "timedelta": type("TD", (dt.timedelta,), {})(1),
    "bytearray": type("BA", (bytearray,), {})(b"x"),
    "tuple": ForgedTuple((1,)),
    "namedtuple subclass": NamedtupleSubclass(1, 2),
    "look-alike name": type("Counter", (dict,), {"__module__": "collections"})(),
}


@pytest.mark.parametrize("name", sorted(SUBCLASSES))
def test_subclasses_of_library_types_stay_opaque(name: str) -> None:
    decoded = decode(encode(SUBCLASSES[name]))
    assert isinstance(decoded, Opaque) and decoded != {} and decoded != ()


def test_fake_namedtuple_methods_are_never_called() -> None:
    called: list[str] = []

    def spy(name: str) -> Any:
        def method(*args: Any) -> Any:
            called.append(name)
            raise AssertionError(name)

        return method

    fields_property = type("P", (tuple,), {"_fields": property(spy("_fields"))})
    assert isinstance(decode(encode(fields_property((1,)))), Opaque)
    # a tuple `_fields` in its class dict: its data crosses, read with tuple's own methods, never the class's
    spied = {m: spy(m) for m in ("__iter__", "__getitem__", "__len__", "__eq__", "__hash__", "__repr__")}
    liar = type("Liar", (tuple,), {"_fields": ("a",), **spied})((0,))
    decoded = decode(encode(liar))
    assert called == [] and decoded == (0,) and decoded.a == 0 and decoded != (4,)
    for bad_fields in (("a", "a"), ("_a",), ("class",), ("a b",), ("a", 1), ["a"]):
        odd = type("Odd", (tuple,), {"_fields": bad_fields})(range(len(bad_fields)))
        assert isinstance(decode(encode(odd)), Opaque)


def test_datetime_with_a_program_tzinfo_is_opaque() -> None:
    class Zone(dt.tzinfo):
        def utcoffset(self, when: object) -> dt.timedelta:
            raise AssertionError("a program's tzinfo must not be called")

    assert isinstance(decode(encode(dt.datetime(2024, 1, 1, tzinfo=Zone()))), Opaque)
    assert isinstance(decode(encode(dt.time(1, tzinfo=Zone()))), Opaque)


# ---------------------------------------------------------------- forged or malformed wire text
def x(key: str, *data: str) -> str:
    """The wire text of a standard-library value from its key and the wire texts of its data."""
    return f"xs{len(key)}:{key}t{len(data)}:" + "".join(data)


def s(text: str) -> str:
    return f"s{len(text)}:{text}"


def strings(*texts: str) -> str:
    return f"t{len(texts)}:" + "".join(s(t) for t in texts)


MALFORMED = {
    "unknown key": x("builtins.eval", s("1")),
    "os.system": x("os.system", s("true")),
    "typename injection": x("namedtuple", s("P(x):pass\nimport os#"), strings("a"), "t1:i1;"),
    "field injection": x("namedtuple", s("P"), strings("a=__import__('os')"), "t1:i1;"),
    "field keyword": x("namedtuple", s("P"), strings("lambda"), "t1:i1;"),
    "field dunder": x("namedtuple", s("P"), strings("__class__"), "t1:i1;"),
    "fields not strings": x("namedtuple", s("P"), "t1:i1;", "t1:i1;"),
    "values too few": x("namedtuple", s("P"), strings("a", "b"), "t1:i1;"),
    "defaultdict factory": x("collections.defaultdict", s("eval"), "d0:"),
    "Counter of a list": x("collections.Counter", "l1:i1;"),
    "deque negative maxlen": x("collections.deque", "l0:", "i-1;"),
    "Decimal not a number": x("decimal.Decimal", s("abc")),
    "Decimal from int": x("decimal.Decimal", "i1;"),
    "Fraction zero": x("fractions.Fraction", "i1;", "i0;"),
    "date out of range": x("datetime.date", "i2024;", "i13;", "i1;"),
    "tzinfo not a timezone": x("datetime.time", "i1;", "i0;", "i0;", "i0;", "o4:Zone", "i0;"),
    "timedelta overflow": x("datetime.timedelta", "i1000000000;", "i0;", "i0;"),
    "wrong arity": x("fractions.Fraction", "i1;"),
    "data not a tuple": "xs17:collections.dequel0:",
    "key not a string": "xi1;t0:",
    "truncated": x("collections.Counter", "d1:s1:a"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_library_values_are_decode_errors(name: str) -> None:
    with pytest.raises(DecodeError):
        decode(MALFORMED[name])


def enum_text(module: str, qualname: str, base: str, name: str | None, value: str, members: str = "t0:") -> str:
    return x("enum", s(module), s(qualname), s(base), "N" if name is None else s(name), value, members)


@pytest.mark.parametrize(
    "text",
    [
        enum_text("__main__", "Units", "Enum", "passed", "i1;"),  # not an enum class
        enum_text("builtins", "int", "Enum", None, "i4;"),
        enum_text("os", "system", "os", None, "i0;"),  # not an enum base
        enum_text("solution", "Other", "Enum", "RED", "i1;", "t1:i1;"),  # members are not (name, value) pairs
        enum_text("solution", "Other", "IntEnum", "A", "s1:a", "t1:t2:s1:As1:a"),  # an IntEnum of a str
        enum_text("solution", "Other", "Enum", None, "i5;", "t1:t2:s9:_missing_i0;"),  # a hook, not a member
        enum_text(__name__, "Color", "Enum", "BLUE", "i3;"),  # not a member of the tests' Color
    ],
)
def test_forged_enum_members_are_opaque(text: str) -> None:
    assert isinstance(decode(text, {"Color": Color}), Opaque)


def test_decoder_only_raises_decode_error_on_mutated_text() -> None:
    rng = random.Random(0)
    texts = [encode(v) for v in ROUND_TRIPS.values()]
    alphabet = "xstlTdNiIfo0123456789:;-.,eE"
    for _ in range(4000):
        text = list(rng.choice(texts))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text))
            action = rng.random()
            if action < 0.4:
                text[i] = rng.choice(alphabet)
            elif action < 0.7:
                del text[i]
            else:
                text.insert(i, rng.choice(alphabet))
        with contextlib.suppress(DecodeError):
            decode("".join(text), {"Color": Color})


def test_harness_imports_no_library_module_until_it_decodes_one() -> None:
    """Start-up time: the harness runs as `python -I -S -c`; decimal, fractions and datetime cost ms to import."""
    script = textwrap.dedent(
        f"""
        import sys
        harness = {{"__name__": "harness"}}
        exec(compile({harness.source()!r}, "harness", "exec"), harness)
        value = [1, 2.5, "s", (None, True), {{3: {{4}}}}, frozenset(), b"x", 1j, range(3), iter([1])]
        harness["decode"](harness["encode"](value))
        lazy = ("decimal", "fractions", "datetime")
        print(sorted(m for m in lazy if m in sys.modules))
        harness["decode"]({x("decimal.Decimal", s("1.5"))!r})
        print(sorted(m for m in lazy if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "['decimal']"], out.stderr


# ---------------------------------------------------------------- end to end, in real sandboxes
@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    box = make_sandbox(timeout_s=TIMEOUT_S, memory_mb=512, max_processes=16, max_output_bytes=1 << 16)
    yield box
    box.close()


def run_asserts(sandbox: Sandbox, program: str, asserts: list[str], setup: str = "") -> RunResult:
    """An MBPP-style row: assert statements (the modules they name are imported for them, as in the reward)."""
    return sandbox.run([asserts_job(textwrap.dedent(program), asserts, textwrap.dedent(setup))])[0]


HONEST: dict[str, tuple[str, list[str], str]] = {  # name: (program, asserts, test setup code)
    "Counter": (
        """
        from collections import Counter
        def count_chars(s):
            return Counter(s)
        """,
        [
            'assert count_chars("aab") == {"a": 2, "b": 1}',
            'assert count_chars("aab").most_common(1) == [("a", 2)]',
            'assert count_chars("") == {}',
        ],
        "",
    ),
    "OrderedDict": (
        """
        from collections import OrderedDict
        def first_seen(xs):
            d = OrderedDict()
            for i, x in enumerate(xs):
                d.setdefault(x, i)
            return d
        """,
        [
            'assert first_seen("bab") == {"a": 1, "b": 0}',
            'assert list(first_seen("bab")) == ["b", "a"]',
            'assert first_seen("bab") != collections.OrderedDict([("a", 1), ("b", 0)])',  # order counts
        ],
        "",
    ),
    "defaultdict": (
        """
        from collections import defaultdict
        def group(words):
            d = defaultdict(list)
            for w in words:
                d[w[0]].append(w)
            return d
        """,
        ['assert group(["ab", "ac", "b"]) == {"a": ["ab", "ac"], "b": ["b"]}', 'assert group([])["x"] == []'],
        "",
    ),
    "deque": (
        """
        from collections import deque
        def last(xs, n):
            return deque(xs, maxlen=n)
        """,
        [
            "assert last([1, 2, 3], 2) == collections.deque([2, 3])",
            "assert last([1, 2, 3], 2).maxlen == 2",
            "assert list(last('ab', 5)) == ['a', 'b']",
        ],
        "",
    ),
    "namedtuple": (
        """
        from collections import namedtuple
        Point = namedtuple("Point", "x y")
        def mid(a, b):
            return Point((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
        def norm1(p):
            return abs(p.x) + abs(p.y)
        """,
        [
            "assert mid((0, 0), (2, 4)) == (1.0, 2.0)",
            "assert mid((0, 0), (2, 4)).y == 2.0",
            "assert repr(mid((0, 0), (2, 4))) == 'Point(x=1.0, y=2.0)'",
            "assert norm1(mid((0, 0), (-2, 4))) == 3.0",  # back into the program: a namedtuple again
        ],
        "",
    ),
    "typing.NamedTuple": (
        """
        from typing import NamedTuple
        class Span(NamedTuple):
            start: int
            end: int
        def find_span(s, sub):
            i = s.find(sub)
            return Span(i, i + len(sub))
        """,
        ['assert find_span("hello", "ll") == (2, 4)', 'assert find_span("hello", "ll").end == 4'],
        "",
    ),
    "Decimal": (
        """
        from decimal import Decimal
        def total(prices):
            return sum(Decimal(p) for p in prices)
        """,
        [
            'assert total(["0.10", "0.20"]) == decimal.Decimal("0.3")',
            'assert str(total(["0.10", "0.20"])) == "0.30"',
            'assert total(["1.5"]) == 1.5',
        ],
        "",
    ),
    "Fraction": (
        """
        from fractions import Fraction
        def harmonic(n):
            return sum(Fraction(1, k) for k in range(1, n + 1))
        """,
        [
            "assert harmonic(3) == fractions.Fraction(11, 6)",
            "assert harmonic(1) == 1",
            "assert harmonic(2).denominator == 2",
        ],
        "",
    ),
    "datetime": (
        """
        import datetime
        def next_day(y, m, d):
            return datetime.date(y, m, d) + datetime.timedelta(days=1)
        def noon_utc(y, m, d):
            return datetime.datetime(y, m, d, 12, tzinfo=datetime.timezone.utc)
        def gap(a, b):
            return b - a
        def alarm():
            return datetime.time(6, 30)
        """,
        [
            "assert next_day(2024, 2, 28) == datetime.date(2024, 2, 29)",
            "assert noon_utc(2024, 1, 1).isoformat() == '2024-01-01T12:00:00+00:00'",
            "assert noon_utc(2024, 1, 1) == datetime.datetime(2024, 1, 1, 13, tzinfo=datetime.timezone("
            "datetime.timedelta(hours=1)))",
            "assert gap(datetime.date(2024, 1, 1), datetime.date(2024, 3, 1)) == datetime.timedelta(days=60)",
            "assert alarm() == datetime.time(6, 30)",
        ],
        "",
    ),
    "IntEnum the tests do not define": (
        """
        from enum import IntEnum
        class Level(IntEnum):
            LOW = 1
            HIGH = 2
        def level(x):
            return Level.HIGH if x > 3 else Level.LOW
        """,
        ["assert level(5) == 2", "assert level(1).name == 'LOW'", "assert level(5) > level(1)"],
        "",
    ),
    "Enum of the test setup": (
        """
        from enum import Enum
        class Suit(Enum):
            HEARTS = "h"
            SPADES = "s"
        def suit_of(card):
            return Suit(card[-1])
        def is_red(suit):
            return suit is Suit.HEARTS
        """,
        ['assert suit_of("Qh") == Suit.HEARTS', 'assert suit_of("2s") is Suit.SPADES', "assert is_red(Suit.HEARTS)"],
        """
        from enum import Enum
        class Suit(Enum):
            HEARTS = "h"
            SPADES = "s"
        """,
    ),
    "bytearray, complex, frozenset": (
        """
        def pack(xs):
            return bytearray(xs)
        def double_root():
            return 2j
        def letters(s):
            return frozenset(s)
        """,
        [
            'assert pack([104, 105]) == bytearray(b"hi") == b"hi"',
            "assert double_root() ** 2 == -4",
            "assert letters('aba') == {'a', 'b'}",
        ],
        "",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_program_returning_library_values_passes(sandbox: Sandbox, name: str) -> None:
    program, asserts, setup = HONEST[name]
    result = run_asserts(sandbox, program, asserts, setup)
    assert result.status == "ok" and result.passed == len(asserts), result


ENUM_PROMPT = '''from enum import Enum


class Color(Enum):
    RED = 1
    GREEN = 2
    BLUE = 3


def warmest(colors):
    """Return the warmest color of the list (RED before GREEN before BLUE)."""
'''
ENUM_TEST = """
def check(candidate):
    assert candidate([Color.BLUE, Color.RED]) == Color.RED
    assert candidate([Color.GREEN, Color.BLUE]) is Color.GREEN
"""


@pytest.mark.integration
def test_enum_of_the_prompt_crosses_both_ways(sandbox: Sandbox) -> None:
    job = humaneval_job(ENUM_PROMPT, "    return min(colors, key=lambda c: c.value)\n", ENUM_TEST, "warmest")
    result = sandbox.run([job])[0]
    assert result.status == "ok" and (result.passed, result.total) == (2, 2), result
    wrong = humaneval_job(ENUM_PROMPT, "    return max(colors, key=lambda c: c.value)\n", ENUM_TEST, "warmest")
    assert sandbox.run([wrong])[0].score() == 0.0


@pytest.mark.integration
def test_code_tests_reward_scores_a_counter_solution(code_sandbox: None) -> None:
    """The bug this fixes: a correct MBPP-style solution that returns a Counter scored 0."""
    fn = build_reward("code_tests", {"timeout_s": 5})
    tests = ['assert char_freq("hello") == {"h": 1, "e": 1, "l": 2, "o": 1}', 'assert char_freq("") == {}']
    good = "```python\nfrom collections import Counter\ndef char_freq(s):\n    return Counter(s)\n```"
    wrong = "from collections import Counter\ndef char_freq(s):\n    return Counter(s.upper())\n"
    assert fn(prompts=["p"] * 2, completions=[good, wrong], test_list=[tests] * 2) == [1.0, 0.0]


# Programs for `f(x) == 2 * x` (tests/test_sandbox.py's TEST) that return a forged library-like value: all score 0.
FORGED = {
    "counter_subclass_eq_true": """
        from collections import Counter
        class Forged(Counter):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = object.__hash__
        def f(x):
            return Forged()
        """,
    "dict_subclass_eq_true": """
        class Forged(dict):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
        def f(x):
            return Forged()
        """,
    "tuple_subclass_eq_true": """
        class Forged(tuple):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = tuple.__hash__
        def f(x):
            return Forged()
        """,
    "namedtuple_subclass_eq_true": """
        from collections import namedtuple
        class Forged(namedtuple("Forged", "a")):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = tuple.__hash__
        def f(x):
            return Forged(0)
        """,
    "fake_namedtuple_fields_property": """
        import gc
        def tamper(self):  # would mark every test passed, were it ever called where the tests run
            print("FIELDS-CALLED", flush=True)
            for obj in gc.get_objects():
                if type(obj).__name__ == "Units":
                    obj.__dict__.update(passed={0, 1, 2}, total=3)
            return ("a",)
        class Forged(tuple):
            _fields = property(tamper)
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = tuple.__hash__
        def f(x):
            return Forged((2 * x,))
        """,
    "enum_eq_true": """
        from enum import Enum
        class Forged(Enum):
            X = 1
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = Enum.__hash__
        def f(x):
            return Forged.X
        """,
    "int_enum_eq_true": """
        from enum import IntEnum
        class Forged(IntEnum):
            X = 0
            def __eq__(self, other): return True
            __hash__ = IntEnum.__hash__
        def f(x):
            return Forged.X
        """,
    "defaultdict_factory_tampers": """
        import gc
        from collections import defaultdict
        def tamper():
            for obj in gc.get_objects():
                if type(obj).__name__ == "Units":
                    obj.__dict__.update(passed={0, 1, 2}, total=3)
            return 0
        def f(x):
            return defaultdict(tamper)
        """,
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_library_values_score_zero(sandbox: Sandbox, name: str) -> None:
    result = run_program(require_containment(sandbox), FORGED[name])
    assert result.score() == 0.0 and result.score("fraction") == 0.0 and not result.infra_error, result
    assert "FIELDS-CALLED" not in result.output  # not even in the program's own process


# A program that replaces the harness's encoder in its own process and answers with crafted wire text.
FORGED_WIRE = """
    import sys
    harness = sys.modules["__main__"]
    honest = harness.encode
    def crafted(value, depth=0):  # every answer to a call of f
        return "t3:s1:v" + {text!r} + "t0:" if value[0] == "v" else honest(value, depth)
    harness.encode = crafted
    def f(x):
        return 0
    """


CRAFTED = {  # wire text: the fraction of f(2) == 4, f(-3) == -6, f(5) == 10 it may pass
    "typename injection": (MALFORMED["typename injection"], 0.0),
    "os.system": (MALFORMED["os.system"], 0.0),
    "defaultdict factory": (MALFORMED["defaultdict factory"], 0.0),
    "enum naming the harness's Units": (enum_text("__main__", "Units", "Enum", "passed", "i4;"), 0.0),
    # an IntEnum member of value 4 equals 4, as the honest answer would: data passes only where it is right
    "IntEnum of value 4": (enum_text("builtins", "int", "IntEnum", "FOUR", "i4;", "t1:t2:s4:FOURi4;"), 1 / 3),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_wire_text_never_forges_a_pass(sandbox: Sandbox, name: str) -> None:
    text, fraction = CRAFTED[name]
    result = run_program(require_containment(sandbox), FORGED_WIRE.format(text=text))
    assert not result.infra_error and result.score("fraction") == pytest.approx(fraction), result
