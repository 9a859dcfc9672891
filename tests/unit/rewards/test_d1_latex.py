"""d1's LaTeX answer handling (rewards/d1/latex.py): one hand case per quirk in the module docstring.

Run: pytest tests/unit/rewards/test_d1_latex.py -q
"""

from __future__ import annotations

import pytest

from diffusion_rl.rewards.d1.latex import (
    d1_boxed_answer,
    d1_is_equiv,
    d1_last_boxed,
    d1_normalize,
    d1_unbox,
)


def test_last_box_with_its_command_and_braces_matched():
    assert d1_last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\boxed{\\frac{1}{2}}"
    assert d1_boxed_answer("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert d1_boxed_answer("\\boxed{\\boxed{3}}") == "3"  # the last "\\boxed" is the inner one
    assert d1_boxed_answer("\\boxed{}") == ""
    assert d1_boxed_answer("\\boxed{5} is it") == "5"  # a box at the very start


def test_no_box_means_the_whole_text():
    text = "<answer>\n\\frac{1}{4}\n</answer>"
    assert d1_last_boxed(text) == text and d1_boxed_answer(text) == text


def test_boxed_with_a_space_wins_and_runs_to_the_next_dollar():
    assert d1_boxed_answer("\\boxed{7} and $\\boxed 5$ end") == "5"
    assert d1_boxed_answer("\\boxed 12 is it") == "12 is it"
    # even when a braced box comes later
    assert d1_boxed_answer("\\boxed 3$ then \\boxed{4}") == "3"
    assert d1_boxed_answer("\\boxed 1$ and \\boxed 2$") == "2"  # the last "\\boxed "
    assert d1_boxed_answer("\\boxed 5$ x$") == "5"  # to the first "$" after it


def test_fbox_keeps_its_command():
    assert d1_boxed_answer("\\fbox{5}") == "\\fbox{5}"
    assert d1_boxed_answer("\\fbox{5} end") == "\\fbox{5}"  # at the very start
    assert d1_boxed_answer("\\fbox{1} \\fbox{2}") == "\\fbox{2}"  # the last one
    assert d1_boxed_answer("\\fbox{5} \\boxed{6}") == "6"  # \\boxed first, \\fbox only without one


def test_unterminated_last_box_is_none():
    assert d1_last_boxed("\\boxed{1} then \\boxed{2") is None
    assert d1_boxed_answer("\\boxed{36>") is None


def test_brace_count_starts_at_the_command():
    # a "}" before the first "{" drives the count negative: the box never closes
    assert d1_last_boxed("\\boxed}{5}") is None
    # "\\}" counts like "}"
    assert d1_boxed_answer("\\boxed{\\}x}") == "\\"  # closes at the escaped brace


def test_unbox_only_strips_a_whole_box():
    assert d1_unbox("\\boxed{x}") == "x"
    assert d1_unbox("\\boxed{x} y") == "\\boxed{x} y"
    assert d1_unbox("plain") == "plain"
    assert d1_unbox("x}") == "x}"  # a closing brace alone is no box
    assert d1_unbox("x \\boxed 5") == "x \\boxed 5"  # "\\boxed " not at the start: unchanged


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("90^\\circ", "90"),
        ("\\$5", "5"),
        ("50\\%", "50"),
        ("5 \\text{ cm}", "5"),  # units after "\\text{ " dropped
        ("k = 5", "5"),  # a left side of at most 2 characters (the space counts)
        ("xy = 5", "xy=5"),  # 3 characters: kept
        ("a = b = 5", "a=b=5"),  # two "=": kept
        (".5", "\\frac{1}{2}"),  # leading "." -> "0.5" -> \\frac{1}{2}
        ("0.5", "\\frac{1}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("3/4", "\\frac{3}{4}"),
        ("+3/4", "+3/4"),  # int() reads it but it does not print back the same
        ("03/4", "03/4"),
        ("\\frac{1", "\\frac{1"),
        ("", ""),
        # the rest of Hendrycks' strip_string, rule by rule
        ("1\\!000\n", "1000"),  # newlines and "\\!" deleted
        ("\\\\frac12", "\\frac{1}{2}"),  # "\\\\" -> "\\"
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),
        ("90^{\\circ}", "90"),
        ("x .5", "x0.5"),  # " ." -> " 0." (then the spaces go)
        ("\\frac{.5}{2}", "\\frac{0.5}{2}"),  # "{." -> "{0."
        ("\\sqrt12", "\\sqrt{1}2"),  # one character only
        ("2\\sqrt{2}+\\sqrt3", "2\\sqrt{2}+\\sqrt{3}"),  # a braced root is kept
        ("\\frac123", "\\frac{1}{2}3"),  # two characters, the rest follows
        ("\\frac{1}{2}+\\frac34", "\\frac{1}{2}+\\frac{3}{4}"),  # every \\frac
    ],
)
def test_normalisation(raw, normal):
    assert d1_normalize(raw) == normal


@pytest.mark.parametrize(
    "raw",
    [
        "5 \\text{ cm} \\text{ m}",  # \\text{ twice: d1 asserts once
        "2\\sqrt",  # \\sqrt at the very end
        "1+\\frac",  # \\frac at the very end
        "x/2",  # one "/" with a side int() rejects: a ValueError d1 does not catch
    ],
)
def test_normalisation_raises_where_d1_raises(raw):
    assert d1_normalize(raw) is None


def test_frac_with_one_character_argument_leaves_the_string():
    assert d1_normalize("\\frac1") == "\\frac1"


def test_equivalence_falls_back_to_raw_equality():
    assert d1_is_equiv("\\frac{1}{2}", "0.5") and d1_is_equiv("\\dfrac12", "\\frac{1}{2}")
    assert d1_is_equiv("1/2", "0.5")  # both become \\frac{1}{2}
    assert not d1_is_equiv("2/4", "\\frac12")  # string normalisation, not mathematics
    assert not d1_is_equiv("0.25", "\\frac14")
    assert d1_is_equiv("x/2", "x/2") and not d1_is_equiv("x/2", "x / 2")  # normalising raises: raw equality
    assert d1_is_equiv(None, None) and not d1_is_equiv("1", None)
