"""Scan bounds never turn a present answer into an absent one: every reward finds its tag wherever it
is in a long completion (bounded by work from the tag, not by position).

Run: pytest tests/unit/rewards/test_answer.py -q
"""

from __future__ import annotations

from diffusion_rl.rewards.answer import completion_text, extract_answer
from diffusion_rl.rewards.countdown import countdown_reward
from diffusion_rl.rewards.gsm8k import (
    gsm8k_correctness_reward,
    soft_format_reward,
    strict_format_reward,
)
from diffusion_rl.rewards.math500 import last_boxed, math_format_reward
from diffusion_rl.rewards.sudoku import parse_answer

JUNK = "x" * 200_000  # longer than any former tail window (100,000 characters)


def test_extract_answer_finds_the_tag_anywhere():
    assert extract_answer("<answer>30+93-100</answer>" + JUNK) == "30+93-100"
    assert extract_answer(JUNK + "<answer>1</answer>" + JUNK + "<answer>2</answer>" + JUNK) == "2"  # the last wins
    assert extract_answer("<answer> 7 " + JUNK[:10]) == "7 " + JUNK[:10]  # unterminated: to the end
    assert extract_answer(JUNK + "no tag") == JUNK + "no tag"


def test_countdown_answer_at_the_start_of_a_long_completion():
    fields = {"numbers": [[30, 100, 93]], "target": [23]}
    assert countdown_reward([""], ["<answer>30+93-100</answer>" + JUNK], **fields) == [1.0]
    assert countdown_reward([""], ["<answer>30+93-101</answer>" + JUNK], **fields) == [0.1]  # present, wrong
    assert countdown_reward([""], ["<answer>" + JUNK], **fields) == [0.1]  # present, unterminated, too long
    assert countdown_reward([""], [JUNK], **fields) == [0.0]  # absent


def test_math_and_gsm8k_answers_at_the_start_of_a_long_completion():
    assert last_boxed("\\boxed{42}" + JUNK) == "42"
    assert math_format_reward([""], ["<answer>\\boxed{3}</answer>" + JUNK]) == [0.5]
    assert gsm8k_correctness_reward([""], ["<answer>72</answer>" + JUNK], answer=["#### 72"]) == [2.0]


def test_format_terms_do_not_cap_the_length():
    long_reasoning = "<reasoning>\n" + JUNK + "\n</reasoning>\n<answer>\n72\n</answer>\n"
    assert strict_format_reward([""], [long_reasoning]) == [0.5]
    assert soft_format_reward([""], [long_reasoning]) == [0.5]


def test_sudoku_digits_after_a_long_answer_prefix():
    grid = "1234341221434321"
    assert parse_answer("<answer>" + JUNK + grid + "</answer>") == grid
    assert parse_answer("<answer>" + JUNK + "</answer>") == "0" * 16


def test_the_first_close_tag_after_the_last_open_one_ends_the_answer():
    assert extract_answer("<answer>a</answer> b </answer>") == "a"
    assert extract_answer("<answer> a </answer>x<answer> b") == "b"  # unterminated: to the end


def test_anything_not_text_reads_as_no_text():
    assert extract_answer(None) == "" and completion_text(42) == "" and completion_text([]) == ""  # type: ignore[arg-type]
    assert completion_text([{"content": None}]) == "" and completion_text([{"role": "assistant"}]) == ""
    assert completion_text([{"content": "x"}, {"content": "y"}]) == "y"
