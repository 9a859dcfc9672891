"""d1's Countdown arithmetic without eval (rewards/d1/arith.py): Python's values on d1's whitelist,
bounded work where d1's eval hangs.

Run: pytest tests/unit/rewards/test_d1_arith.py -q
"""

from __future__ import annotations

import ast
import math
import sys

import pytest

from diffusion_rl.rewards.d1 import arith
from diffusion_rl.rewards.d1.arith import (
    MAX_DEPTH,
    MAX_INT_BITS,
    TOO_LARGE,
    d1_arith_value,
    d1_uses_numbers,
    d1_whitelisted,
)


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("49 + 55 - 53", 51),
        ("7/2", 3.5),  # true division gives a float, as eval does
        ("2**3**2", 512),  # power, right-associative
        ("10//3", 3),  # floor division
        ("+-+5", -5),  # unary signs
        ("1.5*2", 3.0),  # decimals
        (".5+1.", 1.5),
        ("9**-1", 1 / 9),
        ("(1+\n2)", 3),  # a newline inside parentheses
        ("\n1+2", 3),  # leading newlines are fine
        ("  \t1+2", 3),  # eval strips leading spaces and tabs
    ],
)
def test_values_are_pythons(expr, value):
    got = d1_arith_value(expr)
    assert got == value and type(got) is type(value)


def test_negative_to_a_fractional_power_is_complex():
    assert isinstance(d1_arith_value("(0-8)**0.5"), complex)


@pytest.mark.parametrize(
    "expr",
    [
        "1+\n2",  # a newline outside parentheses: SyntaxError
        "007",  # leading zeros: SyntaxError
        "1 2",
        "٣+5",  # passes the Unicode whitelist, rejected by Python's parser
        "5/0",
        "5//0",
        "()",  # a tuple: no number
        "(2)(3)",  # a call
        "...",  # Ellipsis
        "1e3",  # "e" is not whitelisted
        "2^3",
        "abs(1)",
        "",
        "   ",
        " \n 1",  # eval strips spaces, then the indented line fails
    ],
)
def test_what_d1_gets_an_exception_for(expr):
    assert d1_arith_value(expr) is None


def test_huge_powers_are_too_large_not_computed():
    # d1's eval hangs here (an integer of 370 million digits); ours answers at once
    assert d1_arith_value("9**9**9") == TOO_LARGE == math.inf
    assert d1_arith_value("-(9**9**9)") == TOO_LARGE  # the whole expression: wrong for every target
    assert d1_arith_value(f"2**{MAX_INT_BITS - 1}") == 2 ** (MAX_INT_BITS - 1)  # MAX_INT_BITS bits: computed
    assert d1_arith_value(f"2**{MAX_INT_BITS}") == TOO_LARGE
    assert d1_arith_value("1**9**9") == 1 and d1_arith_value("0**9**9") == 0  # |base| <= 1 is cheap
    assert d1_arith_value("2.0**9**9") is None  # float overflow: an exception, as in Python
    assert d1_arith_value("-" * 1000 + "1") is None  # deeper than MAX_DEPTH


def test_whitelist_is_unicode():
    assert d1_whitelisted("٣ + 5\u3000") and not d1_whitelisted("1e3") and not d1_whitelisted("")


def test_uses_numbers_reads_every_run_of_digits():
    assert d1_uses_numbers("49 + 55 - 53", [53, 55, 49])
    assert d1_uses_numbers("1.5 * 3", [1, 5, 3])  # a decimal is two numbers
    assert d1_uses_numbers("٣+5", [3, 5])  # Unicode digits are digits
    assert not d1_uses_numbers("49 + 55", [49, 55, 53])
    assert not d1_uses_numbers("9" * 5000, [1])  # over Python's int-string limit: not valid, no crash


# ---- the bounds at their exact edges ---------------------------------------------------------------
@pytest.fixture
def deep_stack():
    """Room on the stack for a harness that wraps each call of the walk (mutmut's trampolines), so that
    MAX_DEPTH, not Python's recursion limit, decides."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20 * MAX_DEPTH))
    yield
    sys.setrecursionlimit(limit)


def test_nesting_depth_is_allowed_up_to_max_depth_and_no_further(deep_stack):
    # the innermost number of k operators deep sits at depth k: MAX_DEPTH of them are evaluated,
    # one more is an error. Unary signs, a left-nested chain (+ is left-associative) and a
    # right-nested one (** is right-associative; 1 ** 1 keeps every power at 1)
    assert MAX_DEPTH == 400
    assert d1_arith_value("-" * MAX_DEPTH + "1") == 1 and d1_arith_value("-" * (MAX_DEPTH - 1) + "1") == -1
    assert d1_arith_value("-" * (MAX_DEPTH + 1) + "1") is None
    assert d1_arith_value("+".join(["1"] * (MAX_DEPTH + 1))) == MAX_DEPTH + 1
    assert d1_arith_value("+".join(["1"] * (MAX_DEPTH + 2))) is None
    assert d1_arith_value("**".join(["1"] * (MAX_DEPTH + 1))) == 1
    assert d1_arith_value("**".join(["1"] * (MAX_DEPTH + 2))) is None


def test_products_and_sums_are_bounded_by_their_result_not_their_operands():
    # a product's bits are the sum of its factors' bits or one less: 2**49999 (50000 bits) times
    # 2**50000 (50001 bits) is 2**99999, MAX_INT_BITS bits: computed
    assert d1_arith_value("2**49999*2**50000") == 2**99999
    assert d1_arith_value("2**50000*2**50000") == TOO_LARGE  # 2**100000: one bit more
    assert d1_arith_value("3*7") == 21 and d1_arith_value("-3*7") == -21  # small products
    # a sum of two large numbers is as large as its result says, whatever the size of its operands
    assert d1_arith_value("2**60000+2**60000") == 2**60001
    assert d1_arith_value("2**60000-2**60000") == 0


def _refusing(monkeypatch, op):
    """Replace the operation ``op`` by one that records its operands and computes nothing."""
    calls = []
    monkeypatch.setitem(arith._BINARY, op, lambda a, b: calls.append((a, b)) or 0)
    return calls


def test_a_product_sure_to_be_too_large_is_not_computed(monkeypatch):
    # factors of a + b bits multiply to at least a + b - 1 bits: once a + b - 1 > MAX_INT_BITS the
    # product is too large whatever the digits, and is refused before the multiplication
    calls = _refusing(monkeypatch, ast.Mult)
    assert d1_arith_value("2**50000*2**50000") == TOO_LARGE  # 50001 + 50001 bits
    assert calls == []


def test_a_power_sure_to_be_too_large_is_not_computed(monkeypatch):
    # |base| of b bits to the power e is at least 2**((b - 1) e): refused before the power once
    # (b - 1) e > MAX_INT_BITS, for the smallest base that grows (2) as for any other
    calls = _refusing(monkeypatch, ast.Pow)
    for expr in (f"2**{MAX_INT_BITS + 1}", f"(0-2)**{MAX_INT_BITS + 1}", f"3**{MAX_INT_BITS + 1}"):
        assert d1_arith_value(expr) == TOO_LARGE, expr
    assert calls == []
