"""The `calculator` tool: exact arithmetic on a model's expression, parsed with `ast` (never `eval` of its text).

Why not `eval` with empty builtins: the model's text is hostile input (`().__class__.__base__...` escapes an empty
namespace), and even plain arithmetic such as `9**9**9` would hold the training process for minutes. So only
number literals, `+ - * / // % **`, unary signs and parentheses are accepted, every value is an exact `Fraction`
(`0.1 + 0.2` is `0.3`, not `0.30000000000000004`), and a number that would pass `MAX_DIGITS` digits is refused
before it is built: a result from its operands' sizes, a literal from its text (`1e100000000` is 11 characters, and
building its exact value takes minutes). Every refusal raises `ToolFailure` with a message that says what to change:
a failed call, counted as TRL counts failures (agents/failure.py).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

from grpo_pipeline.agents.failure import ToolFailure
from grpo_pipeline.tasks.core import python_ast

MAX_EXPRESSION_CHARS = 2000  # longer input is refused unparsed (ast.parse of deep nesting is itself costly)
MAX_DIGITS = 1000  # the largest numerator or denominator any step may produce, in decimal digits
MAX_NODES = 500  # numbers and operators in one expression
APPROX_DIGITS = 20  # significant digits shown beside a non-terminating fraction
# A float literal's text (underscores removed): its integer part, fraction digits and exponent. The parser has
# accepted it as a Python float already, so this only splits it.
_FLOAT_TEXT = re.compile(r"(\d*)\.?(\d*)(?:[eE]([+-]?\d+))?")

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_HINTS = {
    ast.BitXor: "use ** for powers, not ^",
    ast.MatMult: "use * for multiplication",
    ast.BitAnd: "only + - * / // % ** and parentheses are supported",
    ast.BitOr: "only + - * / // % ** and parentheses are supported",
    ast.LShift: "only + - * / // % ** and parentheses are supported",
    ast.RShift: "only + - * / // % ** and parentheses are supported",
}


class CalcError(ValueError):
    """An expression the calculator will not evaluate; the message is what the model is told."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports integers and decimals, + - * / // % ** and parentheses, e.g. "(12.5 + 7) * 3 // 2". Division is exact:
    a result that does not terminate is given as a fraction with a decimal approximation.

    Args:
        expression: The arithmetic expression to evaluate, e.g. "123456789 * 987654321".

    Returns:
        The exact result.

    Raises:
        ToolFailure: The expression cannot be computed; the message says what to change.
    """
    try:
        return format_number(evaluate(str(expression)))
    except CalcError as e:
        raise ToolFailure(str(e)) from None
    except ZeroDivisionError:
        raise ToolFailure("division by zero") from None
    except (OverflowError, MemoryError, RecursionError) as e:  # not expected within the bounds above; still a message
        raise ToolFailure(f"{type(e).__name__}: the expression is too large; split it into steps") from None


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; raises CalcError (or ZeroDivisionError) for what it will not compute."""
    expression = expression.strip()  # the node positions below index this text
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters; split it into steps")
    try:
        tree = python_ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise CalcError(f"not an arithmetic expression ({e.msg}); write e.g. 2 * (3 + 4)") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalcError(f"the expression has {nodes} parts, more than {MAX_NODES}; split it into steps")
    return _value(tree.body, expression)


def _value(node: ast.expr, source: str) -> Fraction:
    """The exact value of one node of the parsed expression."""
    if isinstance(node, ast.Constant):
        return _literal(node, source)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, source), _value(node.right, source)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) not in _BINARY:
            hint = _HINTS.get(type(node.op), "only + - * / // % ** and parentheses are supported")
            raise CalcError(f"unsupported operator in {ast.get_source_segment(source, node)!r}: {hint}")
        return _bounded(Fraction(_BINARY[type(node.op)](left, right)))
    if isinstance(node, ast.Tuple):
        raise CalcError("commas are not allowed: write 1234567, not 1,234,567, and one expression per call")
    what = ast.get_source_segment(source, node) or type(node).__name__
    raise CalcError(f"{what!r} is not arithmetic: only numbers, + - * / // % ** and parentheses are allowed")


def _literal(node: ast.Constant, source: str) -> Fraction:
    """A number literal, read from its source text so that 0.1 is exactly 1/10 (not the float nearest to it)."""
    if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
        raise CalcError(f"{node.value!r} is not a number")
    text = ast.get_source_segment(source, node) or repr(node.value)
    # an int is already built, by the parser, from at most MAX_EXPRESSION_CHARS characters (hex and octal too)
    value = Fraction(node.value) if isinstance(node.value, int) else _float_literal(text.replace("_", ""))
    if value is None or _too_long(value):
        shown = text if len(text) <= 40 else f"{text[:20]}...{text[-10:]}"
        raise CalcError(
            f"the number {shown!r} has more than {MAX_DIGITS} digits when written out exactly; write a smaller number "
            "(a smaller exponent)"
        )
    return value


def _float_literal(text: str) -> Fraction | None:
    """The exact value of a float literal's text, or None, before it is built, when it would have more than
    `MAX_DIGITS` digits.

    The value is `int(digits) * 10**scale` with `digits` stripped of zeros at both ends. Past |scale| = 4 * MAX_DIGITS
    it surely has too many digits (10**scale has scale + 1; the denominator 10**-scale, reduced by a numerator that
    has no factor 10, keeps at least 2**-scale), so it is refused unbuilt; below that, building it is cheap and
    `_too_long` decides exactly.
    """
    match = _FLOAT_TEXT.fullmatch(text)
    if match is None:
        raise CalcError(f"{text!r} is not a number this calculator reads")
    whole, fraction, exponent = match.groups()
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return Fraction(0)
    stripped = digits.rstrip("0")
    scale = int(exponent or 0) - len(fraction) + len(digits) - len(stripped)
    if abs(scale) > 4 * MAX_DIGITS:
        return None
    return Fraction(int(stripped)) * Fraction(10) ** scale


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """`base ** exponent` for a whole exponent, refused before computing when the result would be too large."""
    if exponent.denominator != 1:
        raise CalcError("only whole-number exponents are supported (the result must be exact)")
    n = abs(exponent.numerator)
    if base in (0, 1, -1) or n <= 1:
        return base**exponent.numerator
    # the result has about n * log10(max(|numerator|, denominator)) digits: refused before pow allocates anything
    # (at least n * log10(2) here, so an exponent past 4 * MAX_DIGITS is refused before that product, which as a
    # float overflows for an exponent such as 10**999)
    if n > 4 * MAX_DIGITS:
        raise CalcError(f"the exponent is too large: the result would have more than {MAX_DIGITS} digits")
    digits = n * max(math.log10(abs(base.numerator)), math.log10(base.denominator))
    if digits > MAX_DIGITS:
        raise CalcError(f"the result would have about {digits:.0f} digits, more than {MAX_DIGITS}")
    return _bounded(base**exponent.numerator)


def _digits(n: int) -> int:
    """Decimal digits of |n| (from its bit length: exact enough, and free for huge numbers)."""
    return max(1, math.ceil(abs(n).bit_length() * math.log10(2)))


def _too_long(value: Fraction) -> bool:
    """Whether the numerator or the denominator of `value` passes MAX_DIGITS digits."""
    return max(_digits(value.numerator), _digits(value.denominator)) > MAX_DIGITS + 1


def _bounded(value: Fraction) -> Fraction:
    """`value`, or CalcError when its numerator or denominator passes MAX_DIGITS digits."""
    if _too_long(value):
        raise CalcError(f"a step of the calculation has more than {MAX_DIGITS} digits")
    return value


def format_number(value: Fraction) -> str:
    """An exact decimal when `value` terminates (only 2s and 5s in its denominator), else `p/q (~ decimal)`."""
    if value.denominator == 1:
        return str(value.numerator)
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den == 1:
        places = max(twos, fives)
        scaled = value.numerator * 10**places // value.denominator
        sign, digits = ("-" if scaled < 0 else ""), str(abs(scaled)).rjust(places + 1, "0")
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    approx = Decimal(value.numerator) / Decimal(value.denominator)
    return f"{value.numerator}/{value.denominator} (about {approx:.{APPROX_DIGITS}g})"
