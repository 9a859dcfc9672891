"""d1's Countdown arithmetic without eval (rewards/d1/arith.py): Python's values on d1's whitelist,
bounded work where d1's eval hangs.

Run: pytest tests/unit/rewards/test_d1_arith.py -q
"""

from __future__ import annotations

import math

import pytest

from diffusion_rl.rewards.d1.arith import (
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
