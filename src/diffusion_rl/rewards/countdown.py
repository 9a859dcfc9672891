"""Countdown reward (docs/methods.md §5): combine the given numbers with + - * / into the target.

The answer is an arithmetic expression, read where the prompt asks for it (``rewards/prompted.py``;
d1's evaluation prompt asks for ``<answer>\\n\\boxed{...}\\n</answer>``, its training prompt for a bare
``<answer>``): the last ``\\boxed{}`` of the last ``<answer>`` block, else that block's text; without
an ``<answer>`` tag (or with an empty block) the last non-empty ``\\boxed{}`` anywhere. It is
evaluated by a small AST walker over exact ``Fraction`` arithmetic, never by ``eval``:

* 1.0: the expression uses each given number exactly once (multiset equality), only ``+ - * /``
  and parentheses, and equals the target within 1e-5;
* 0.1: an answer is present (an ``<answer>`` tag or a box) but the expression is wrong or invalid;
* 0.0: no answer.

Decisions (documented here because the papers leave them open):

* **Unary minus and plus are allowed** (``-30+93+...``, ``+((43-92)+70)``): they cannot reuse or
  skip a number (d1's ``eval`` accepts both). ``**``, ``//``, ``%``, decimals, names and calls are
  rejected (d1 accepts ``**``, ``//`` and decimals: ``rewards/d1/arith.py``).
* **LaTeX operators** inside a box are read as the prompt's operations: ``\\times`` and ``\\cdot``
  as ``*``, ``\\div`` as ``/`` (as d1's evaluation does).
* **A trailing ``= target`` is stripped**: ``30+93-100 = 23`` is read as ``30+93-100`` when the
  right-hand side is a plain number equal to the target; any other ``=`` makes the answer invalid.
* **Only ASCII digits are digits.** ``"٣"`` is not 3 (Python's ``int`` and ``\\d`` would accept it);
  the character whitelist rejects it, so such an answer scores 0.1.
* Whitespace (spaces, tabs, newlines) inside the expression is ignored.

``solve_countdown`` is a brute-force solver (exact arithmetic, up to 6 numbers) for tests and a
reference policy.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Sequence
from fractions import Fraction
from itertools import combinations
from typing import Any

from diffusion_rl.rewards.answer import column, completion_text
from diffusion_rl.rewards.math500 import last_boxed
from diffusion_rl.rewards.prompted import answer_block

log = logging.getLogger(__name__)

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1  # an <answer> is present but wrong or invalid
TOLERANCE = 1e-5

_ALLOWED_CHARS = frozenset("0123456789+-*/() ")
_WHITESPACE = str.maketrans({"\t": " ", "\n": " ", "\r": " "})
_INT_RE = re.compile(r"[0-9]+")
_NUMBER_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")  # a target such as "23" or "23.0"
_MAX_NODES = 1000
_MAX_DEPTH = 250
_MAX_SOLVER_NUMBERS = 6


class _Invalid(Exception):
    """The expression is outside the allowed grammar."""


def _walk(node: ast.AST, depth: int, budget: list[int], used: list[int]) -> Fraction:
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        raise _Invalid("expression too large")
    if isinstance(node, ast.Expression):
        return _walk(node.body, depth + 1, budget, used)
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # bool is an int subclass; floats/complex are rejected
            raise _Invalid("only integer literals")
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _walk(node.operand, depth + 1, budget, used)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _walk(node.left, depth + 1, budget, used)
        right = _walk(node.right, depth + 1, budget, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise _Invalid("division by zero")
            return left / right
    raise _Invalid(f"node {type(node).__name__} not allowed")


def _parse_arith(expr: Any, max_len: int) -> tuple[Fraction, list[int]] | None:
    """``(value, integer literals in order)`` of an allowed expression, else None."""
    if not isinstance(expr, str) or len(expr) > max_len:
        return None
    expr = expr.translate(_WHITESPACE).strip()
    if not expr or not set(expr) <= _ALLOWED_CHARS:
        return None
    try:  # the length bound keeps the parser cheap; deep nesting can still raise anything
        tree = ast.parse(expr, mode="eval")
        used: list[int] = []
        value = _walk(tree, 0, [_MAX_NODES], used)
    except Exception:  # noqa: BLE001 - SyntaxError, RecursionError, MemoryError, _Invalid, ...
        return None
    return value, used


def safe_eval_arith(expr: str, max_len: int = 200) -> Fraction | None:
    """Exact value of an expression of integers, ``+ - * /``, unary minus / plus and parentheses.

    Returns None for anything else: too long, other characters, ``**``, ``//``, syntax errors,
    division by zero, more than 1000 AST nodes or nesting deeper than 250 (bounds that only
    matter when ``max_len`` is raised).
    """
    parsed = _parse_arith(expr, max_len)
    return None if parsed is None else parsed[0]


def countdown_numbers_used(expr: str, max_len: int = 200) -> list[int]:
    """The integer literals in ``expr`` in order of appearance (ASCII digits only).

    Strings longer than ``max_len`` are not inspected (returns ``[]``): they are never valid answers.
    """
    if not isinstance(expr, str) or len(expr) > max_len:
        return []
    return [int(tok) for tok in _INT_RE.findall(expr)]


def _as_numbers(value: Any) -> list[int] | None:
    """Accept ``[30, 100, 93]`` or ``"30,100,93"`` (also ``"[30, 100, 93]"``)."""
    if isinstance(value, str):
        if len(value) > 1000:
            return None
        return [int(tok) for tok in _INT_RE.findall(value)]
    if isinstance(value, Sequence):
        out = []
        for v in value:
            if isinstance(v, bool):
                return None
            if isinstance(v, int):
                out.append(v)
            elif isinstance(v, str) and _INT_RE.fullmatch(v.strip()):
                out.append(int(v.strip()))
            else:
                return None
        return out
    return None


def _as_target(value: Any) -> Fraction | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value) if value == value and abs(value) != float("inf") else None
    if isinstance(value, str) and len(value) < 100 and _NUMBER_RE.fullmatch(value.strip()):
        return Fraction(value.strip())
    return None


def _strip_equals(expr: str, target: Fraction) -> str | None:
    """``"a+b-c = 23"`` -> ``"a+b-c"`` when the right side is a number equal to the target."""
    if "=" not in expr:
        return expr
    lhs, _, rhs = expr.partition("=")
    rhs = rhs.strip()
    if "=" in rhs or len(rhs) > 100 or not _NUMBER_RE.fullmatch(rhs):
        return None
    return lhs if abs(Fraction(rhs) - target) < TOLERANCE else None


_LATEX_OPERATORS = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"))


def countdown_expression(completion: Any) -> str | None:
    """The expression the completion answers (module docstring); "" for an answer tag with nothing
    readable, None when the completion has no answer at all."""
    text = completion_text(completion)
    block = answer_block(text)
    if block is None or not block:
        boxed = last_boxed(text)
        expr = boxed if boxed else ("" if block is not None else None)
    else:
        expr = last_boxed(block) or block
    if expr is None:
        return None
    for latex, op in _LATEX_OPERATORS:
        expr = expr.replace(latex, op)
    return expr


def countdown_score(completion: Any, numbers: Any, target: Any) -> float:
    """Reward of one completion (see the module docstring)."""
    expr = countdown_expression(completion)
    if expr is None:
        return 0.0
    nums, goal = _as_numbers(numbers), _as_target(target)
    if nums is None or goal is None:
        return FORMAT_REWARD
    stripped = _strip_equals(expr, goal) if len(expr) <= 1000 else None
    parsed = None if stripped is None else _parse_arith(stripped, 200)
    if parsed is None:
        return FORMAT_REWARD
    value, used = parsed
    if sorted(used) != sorted(nums) or abs(value - goal) >= TOLERANCE:
        return FORMAT_REWARD
    return CORRECT_REWARD


def countdown_reward(
    prompts: list[str], completions: list[str], numbers: list[Any], target: list[Any], **_: Any
) -> list[float]:
    """TRL-style reward: 1.0 correct, 0.1 answer present but wrong/invalid, 0.0 no answer."""
    comps = list(completions) if isinstance(completions, Sequence) else []
    out = []
    for comp, nums, tgt in zip(comps, column(numbers, len(comps)), column(target, len(comps))):
        try:
            out.append(countdown_score(comp, nums, tgt))
        except Exception as err:  # noqa: BLE001 - defence in depth: a reward must not kill a run
            log.warning("countdown_reward failed (%r); scoring 0.0", err)
            out.append(0.0)
    return out


def solve_countdown(numbers: Sequence[int], target: int | str) -> str | None:
    """An expression using every number exactly once that equals ``target``, or None.

    Exhaustive search over pairwise combinations with exact arithmetic (any intermediate value
    allowed, as in the reward). At most 6 numbers.
    """
    nums, goal = _as_numbers(numbers), _as_target(target)
    if not nums or goal is None or len(nums) > _MAX_SOLVER_NUMBERS:
        return None
    seen: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(v for v, _ in items))
        if key in seen:  # the same multiset of values failed before
            return None
        seen.add(key)
        for i, j in combinations(range(len(items)), 2):
            (a, ea), (b, eb) = items[i], items[j]
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            options = [(a + b, f"{ea}+{eb}"), (a * b, f"{ea}*{eb}")]
            options += [(a - b, f"{ea}-{eb}"), (b - a, f"{eb}-{ea}")]
            if b != 0:
                options.append((a / b, f"{ea}/{eb}"))
            if a != 0:
                options.append((b / a, f"{eb}/{ea}"))
            for value, text in options:
                found = search(rest + [(value, text if not rest else f"({text})")])
                if found is not None:
                    return found
        return None

    return search([(Fraction(n), str(n)) for n in nums])
