"""The Countdown reward's bounds and field forms at their exact edges (rewards/countdown.py's module
docstring and docstrings are the statement): each length, node and depth limit accepts its limit and
refuses one more; targets and numbers in every accepted form; the tolerance is strict; a completion
whose scoring raises scores 0.0."""

from __future__ import annotations

from fractions import Fraction

import pytest

from diffusion_rl.rewards import countdown as cd
from diffusion_rl.rewards.countdown import (
    TOLERANCE,
    countdown_expression,
    countdown_numbers_used,
    countdown_reward,
    countdown_score,
    safe_eval_arith,
    solve_countdown,
)

NUMS, OK = [30, 100, 93], "30+93-100"  # = 23


def answer(expr: str) -> str:
    return f"<answer>{expr}</answer>"


def test_every_allowed_character_in_one_expression():
    assert safe_eval_arith("(10 + 23) * 45 / 6 - 789") == Fraction(-1083, 2)  # all 17 allowed characters


def test_division_by_one_and_by_zero():
    assert safe_eval_arith("6/1") == 6 and safe_eval_arith("6/(2-2)") is None


def test_the_length_limit_takes_its_limit():
    assert safe_eval_arith("1+2", max_len=3) == 3 and safe_eval_arith("1+2", max_len=2) is None


def nested(n: int) -> str:
    """``n`` unary minuses before a 1: the literal sits at AST depth ``n + 1``."""
    return "-" * n + "1"


def test_nesting_is_allowed_to_depth_250_and_no_deeper():
    """Each kind of child counts one level: the expression's body, a unary operand, a binary operation's
    left and right operands (the literal at depth 250 is accepted, at 251 refused)."""
    assert safe_eval_arith(nested(249), 2000) == -1 and safe_eval_arith(nested(250), 2000) is None
    left = lambda n: "-" * n + "1+1"  # the left operand's literal at depth n + 2
    right = lambda n: "1+" + "-" * n + "1"
    assert safe_eval_arith(left(248), 2000) == 2 and safe_eval_arith(left(249), 2000) is None
    assert safe_eval_arith(right(248), 2000) == 2 and safe_eval_arith(right(249), 2000) is None


def balanced(leaves: int) -> str:
    if leaves == 1:
        return "1"
    half = leaves // 2
    return f"({balanced(half)})+({balanced(leaves - half)})"


def test_at_most_1000_nodes():
    """500 leaves make 999 operations and literals and the expression node: 1000, accepted; one unary
    minus more is refused (the depth stays near 10)."""
    assert safe_eval_arith(balanced(500), 10_000) == 500
    assert safe_eval_arith("-" + balanced(500), 10_000) is None


@pytest.mark.parametrize("target,expected", [(23.0, 1.0), (float("nan"), 0.1), (float("inf"), 0.1),
                                             (float("-inf"), 0.1), ("23" + " " * 97, 1.0), ("23" + " " * 98, 0.1)])
def test_targets_as_floats_and_strings(target, expected):
    """A float target that is a number counts; NaN and infinities are no target (0.1). A string target
    is read up to 99 characters."""
    assert countdown_score(answer(OK), NUMS, target) == expected


@pytest.mark.parametrize("numbers,expected", [(["30", " 100 ", "93"], 1.0), ([30, 100.0, 93], 0.1), ([30, True, 93], 0.1),
                                              ("30,100,93".ljust(1000), 1.0), ("30,100,93".ljust(1001), 0.1)])
def test_numbers_as_strings_lists_and_their_length_limit(numbers, expected):
    assert countdown_score(answer(OK), numbers, 23) == expected


def test_invalid_numbers_with_a_valid_target_are_a_format_answer():
    assert countdown_score(answer(OK), [True], 23) == 0.1 and countdown_score(answer(OK), NUMS, True) == 0.1


@pytest.mark.parametrize("rhs,expected", [("0" * 98 + "23", 1.0), ("0" * 99 + "23", 0.1), ("abc", 0.1), ("24", 0.1)])
def test_a_trailing_equals_is_read_up_to_100_characters(rhs, expected):
    assert countdown_score(answer(f"{OK} = {rhs}"), NUMS, 23) == expected


def test_the_expression_is_read_up_to_1000_characters_before_an_equals():
    expr = lambda n: OK + " = " + " " * (n - len(OK) - 5) + "23"  # n characters in all
    assert len(expr(1000)) == 1000
    assert countdown_score(answer(expr(1000)), NUMS, 23) == 1.0
    assert countdown_score(answer(expr(1001)), NUMS, 23) == 0.1


def test_the_expression_itself_is_read_up_to_200_characters():
    padded = lambda n: "30" + " " * (n - len(OK)) + "+93-100"  # n characters, the spaces inside
    assert countdown_score(answer(padded(200)), NUMS, 23) == 1.0
    assert countdown_score(answer(padded(201)), NUMS, 23) == 0.1


def decimal(x: Fraction) -> str:
    """The exact decimal text of a dyadic fraction (a float's value)."""
    text = f"{float(x):.80f}".rstrip("0")
    assert Fraction(text) == x
    return text


def test_the_tolerance_is_strict():
    """A value exactly TOLERANCE (the float's exact value, written as a decimal) from the target is wrong,
    whether the expression's value or a trailing ``= rhs`` misses by it; half of it is right."""
    tol = Fraction(TOLERANCE)
    assert countdown_score(answer("5-5"), [5, 5], "-" + decimal(tol)) == 0.1
    assert countdown_score(answer("5-5"), [5, 5], "-" + decimal(tol / 2)) == 1.0
    assert countdown_score(answer(f"5-5 = {decimal(tol)}"), [5, 5], 0) == 0.1
    assert countdown_score(answer(f"5-5 = {decimal(tol / 2)}"), [5, 5], 0) == 1.0


def test_an_empty_answer_reads_a_box_elsewhere_or_nothing():
    assert countdown_expression("<answer></answer>") == ""
    assert countdown_expression("\\boxed{1+2} then <answer></answer>") == "1+2"
    assert countdown_expression("no answer") is None


def test_numbers_used_reads_up_to_200_characters():
    assert countdown_numbers_used("1+2".ljust(200)) == [1, 2] and countdown_numbers_used("1+2".ljust(201)) == []


def test_a_scoring_failure_scores_zero_and_no_completions_score_nothing(monkeypatch):
    def boom(*_):
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(cd, "countdown_score", boom)
    assert countdown_reward(["p"], [answer(OK)], [NUMS], [23]) == [0.0]
    assert countdown_reward([], None, [], []) == []  # type: ignore[arg-type]


def test_the_solver_limits_and_its_expressions():
    assert solve_countdown([1, 2], 3) == "1+2"  # no parentheses around the whole
    assert safe_eval_arith(solve_countdown([1, 2, 3, 4, 5, 6], 21) or "") == 21  # 6 numbers: searched
    assert solve_countdown([1] * 7, 7) is None  # 7: refused
    assert solve_countdown([True], 5) is None and solve_countdown([], 5) is None
    assert solve_countdown([0, 3], 7) is None  # no division by the zero on the way
