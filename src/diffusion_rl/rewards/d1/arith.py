"""d1's Countdown arithmetic without ``eval``: the value d1's ``eval`` would give, in bounded time.

d1 (``eval/parse_and_get_acc.py`` and ``diffu-grpo/reward_func.py``) checks that an expression uses
the given numbers (every run of digits, sorted, equals the sorted numbers) and then runs Python's
``eval`` on it when every character is a digit, ``+ - * / ( ) .`` or whitespace. That whitelist lets
through more than ``+ - * /`` on integers, and d1 scores all of it; so do we, with Python's own
number semantics (the same operators on the same int / float / complex values):

* ``**`` (power) and ``//`` (floor division), unary ``+`` and ``-``, decimals (``1.5``, ``.5``,
  ``1.``): ``2**3**2``, ``10//3``, ``+-+5``. Its ``\\d`` and ``\\s`` are Unicode, so ``٣+5`` passes
  the whitelist; Python's parser then rejects it (as its ``eval`` does).
* ``eval`` strips leading spaces and tabs (not newlines); ``ast.parse`` is ``eval``'s parser, so
  ``1+\\n2``, ``007`` or ``1 2`` fail here exactly as there.
* Negative numbers to fractional powers give complex values, as in Python: ``(-8)**0.5``.

Where we cannot follow d1 (bounded work, no ``eval``):

* **Huge powers are not computed.** d1's ``eval`` hangs on ``9**9**9`` (an integer of 370 million
  digits). An expression with an integer (intermediate) result above ``MAX_INT_BITS`` bits is
  reported as :data:`TOO_LARGE` (``math.inf``) as a whole: wrong for every caller, as d1's
  finished result would be for any target below ``2**100000``. (d1 would still be right on ``0*9**9**9`` with a target of 0: no such item exists.)
* **Nesting deeper than** ``MAX_DEPTH`` **operators** (e.g. a 500-fold unary minus) counts as an
  error; CPython's own limits sit near 200 parentheses and ~1000 compiler frames.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

MAX_INT_BITS = 100_000  # an integer result larger than this is TOO_LARGE
MAX_DEPTH = 400
TOO_LARGE = math.inf  # stands for "a finite number too large to be any target"

Number = int | float | complex
_DIGIT_RUN_RE = re.compile(r"\d+")  # Unicode digits, as d1's pattern
_OPERATOR_CHARS = frozenset("+-*/().")
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class _TooLarge(Exception):
    """The exact integer would exceed MAX_INT_BITS bits."""


class _NotANumber(Exception):
    """A node eval would evaluate to a non-number or reject (a call, a tuple, ``...``, too deep)."""


def d1_whitelisted(expr: str) -> bool:
    """d1's ``re.match(r"^[\\d+\\-*/().\\s]+$", expr)``: non-empty, every character a Unicode
    decimal digit, whitespace or one of ``+-*/().``."""
    return bool(expr) and all(c in _OPERATOR_CHARS or c.isdecimal() or c.isspace() for c in expr)


def d1_uses_numbers(expr: str, numbers: Sequence[int]) -> bool:
    """d1's ``validate_equation``: the runs of (Unicode) digits, as integers and sorted, equal the
    sorted numbers. ``1.5`` holds the two numbers 1 and 5."""
    try:
        return sorted(int(tok) for tok in _DIGIT_RUN_RE.findall(expr)) == sorted(numbers)
    except (ValueError, TypeError):  # a run over Python's int-string limit; non-int numbers
        return False


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _TooLarge
    return value


def _binary(op: type, left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int):
        # predict the size first: the product or power itself is the expensive part
        if op is ast.Mult and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            raise _TooLarge
        if op is ast.Pow and right > 0 and abs(left) > 1 and (abs(left).bit_length() - 1) * right > MAX_INT_BITS:
            raise _TooLarge
    return _check_size(_BINARY[op](left, right))


def _value(node: ast.AST, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _NotANumber
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):  # ``...`` is the only other literal the whitelist allows
            raise _NotANumber
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _value(node.left, depth + 1)  # Python evaluates the left operand first
        return _binary(type(node.op), left, _value(node.right, depth + 1))
    raise _NotANumber  # a call ``(2)(3)`` or a tuple ``()``: eval raises or returns no number


def d1_arith_value(expr: str) -> Number | None:
    """The number d1's ``eval(expr, {"__builtins__": None}, {})`` gives after its whitelist, None
    where d1 gets an exception (or no number), :data:`TOO_LARGE` for an integer too large to compute."""
    if not isinstance(expr, str) or not d1_whitelisted(expr):
        return None
    try:
        tree = ast.parse(expr.lstrip(" \t"), mode="eval")  # builtin eval strips these, compile does not
        value = _value(tree.body, 0)
    except _TooLarge:
        return TOO_LARGE
    except (_NotANumber, SyntaxError, ValueError, ArithmeticError, TypeError, RecursionError, MemoryError):
        return None
    return value if isinstance(value, int | float | complex) else None
