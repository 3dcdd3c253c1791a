"""stdout comparison rules: whether a stdin/stdout case's output passes (`outputs_match`, `STDOUT_RULES`).

Each stdin/stdout format's tests are judged as that dataset's own checker judges them (docs/rewards.md has the
table, with the source of each): the host names the rule with the tests (`spec["stdout_rule"]`, set by the format
in rewards/code_formats/). An unknown rule is the host's error (the row is unscored), not the program's.

Trusts: nothing of the program; a rule sees only its stdout, as text, and an exception while comparing (a
`Decimal('sNaN')` compared, a number too large) is a wrong answer, never an unscored row. Imports nothing of this
package (`decimal` on first use only).
"""

from __future__ import annotations

# The harness runs as `python -I -S -c`, where importing `typing` would cost ~13 ms per sandbox start: the names
# below exist for type checkers only (which treat any `TYPE_CHECKING` as true), and annotations are never evaluated.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


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
    from decimal import Decimal  # imported only when a line differs (~2 ms)

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
