"""Running the tests against the program, in the tests' process, and counting what passed.

`run_tests` returns the verdict's payload; one runner per style of test: HumanEval's `check(candidate)`
(`_run_check`), call-based cases (`_run_call_cases`: APPS/TACO fn_name, LiveCodeBench functional, LeetCode
entry points), assert lists (`_run_asserts`: MBPP) and stdin/stdout cases (`_run_stdio`). Pass or fail per test
unit is kept here only (`Units`). Whatever comes out of the program's objects while the tests run them (any
exception, a BaseException, one whose message raises) fails the tests; only tests that cannot be set up
(`TestsBroken`: they do not compile, their definitions raise, the rule is unknown) leave the row unscored. The
program's names are bound into the tests' namespace only where the tests use them, and never over a builtin or a
name the tests protect (`_bind`), so a program cannot redefine `set`, `round` or `math` for its tests.

Trusts: the tests (the host's, from a dataset); never the program, whose answers arrive through channel.py.
Imports: wire.py, calls.py, channel.py, compare.py.
"""

# ruff: noqa: SIM105  (try/except/pass, not contextlib.suppress: importing contextlib costs ~1 ms per sandbox start)
from __future__ import annotations

import builtins

from .calls import CandidateFailure
from .channel import Channel, TestsSide
from .compare import STDOUT_RULES, outputs_match
from .wire import use_references

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def run_tests(spec: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Run the tests against the program; returns the payload of the verdict.

    Whatever comes out of the program's objects while the tests run them (any exception, a BaseException, one whose
    message raises) fails the tests; only tests that cannot be set up (`TestsBroken`) leave the row unscored.
    """
    result: dict[str, Any] = {
        "loaded": False,
        "passed": 0,
        "total": int(spec["total"]),
        "completed": False,
        "error": "",
        "timeout": False,
    }
    units = Units(result["total"])
    use_references(TestsSide(channel))
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
        result["error"] = describe(e)
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
        return describe(e)
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
            self.first_error = f"test {i}: {describe(error)}"


def describe(error: BaseException) -> str:
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
        raise TestsBroken(f"{what}: {describe(e)}") from None
