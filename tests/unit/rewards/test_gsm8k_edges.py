"""GSM8K's rewards at their edges (rewards/gsm8k.py's module docstring and docstrings are the
statement): d1's format regexes against our scans on every arrangement of their pieces, the gold field's
forms, the number reader's limits, where the prediction is read, and a reward whose scoring raises."""

from __future__ import annotations

import itertools
import logging
import re

import pytest

from diffusion_rl.rewards import gsm8k as g

D1_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", re.DOTALL)
D1_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
# the pieces d1's strict pattern is made of, and what can sit between them
PIECES = ["<reasoning>\n", "\n</reasoning>\n<answer>\n", "\n</answer>\n", "\n", "a", "</answer>", "<reasoning>"]


def test_the_format_scans_are_d1s_regexes_on_every_arrangement_of_their_pieces():
    """Every sequence of up to 5 pieces (19,607 texts): shared newlines between the middle and the end,
    an empty answer, two middles, a final extra newline, a close tag at the very start."""
    texts = ("".join(p) for n in range(1, 6) for p in itertools.product(PIECES, repeat=n))
    for text in texts:
        assert g.strict_format_ok(text) == bool(D1_STRICT.match(text)), repr(text)
        assert g.soft_format_ok(text) == bool(D1_SOFT.match(text)), repr(text)


@pytest.mark.parametrize("text,ok", [
    ("<reasoning>\nr\n</reasoning>\n<answer>\n\n</answer>\n\n", True),  # empty answer, $ before the last newline
    ("<reasoning>\nr\n</reasoning>\n<answer>\n</answer>\n\n", False),  # the middle and the end share a newline
    ("<reasoning>\na\n</reasoning>\n<answer>\nb\n</reasoning>\n<answer>\n</answer>\n", True),  # the earliest middle
])
def test_strict_format_cases_written_out(text, ok):
    assert g.strict_format_ok(text) is ok and bool(D1_STRICT.match(text)) is ok


def test_not_text_is_no_format():
    assert g.strict_format_ok(None) is False and g.soft_format_ok(None) is False  # type: ignore[arg-type]
    assert g.xml_count_score(None) == 0.0  # type: ignore[arg-type]


def test_the_trailing_penalty_counts_from_the_last_close_tag_wherever_it_is():
    assert g.xml_count_score("</answer><reasoning>\n") == pytest.approx(0.125 - 0.001 * len("<reasoning>"))
    two = "<reasoning>\n</answer>ab</answer>c"
    assert g.xml_count_score(two) == pytest.approx(2 * 0.125 - 0.001)  # two tags once each; only "c" trails


@pytest.mark.parametrize("field,gold", [(72, "72"), (True, ""), (3.5, ""), ("#### 1,234", "1234"), ("no marker 5", "no marker 5")])
def test_the_gold_field(field, gold):
    assert g.gsm8k_gold(field) == gold


@pytest.mark.parametrize("text,number", [("1" * 100, "1" * 100), ("1" * 101, None), ("5X", None), ("5..", "5"),
                                         ("-0.50", "-0.5"), ("$1,234.00", "1234"), (".5", "0.5")])
def test_the_number_reader(text, number):
    assert g.normalize_number(text) == number


def test_where_the_prediction_is_read():
    assert g.extract_gsm8k_prediction("<answer>\\boxed{12} (or 13)</answer>") == "12"  # the box, not the last number
    assert g.gsm8k_correct("<answer>\\boxed{.5}</answer>", "0.5")  # a plain number in the box, as it is
    assert g.gsm8k_correct("<answer>72.0</answer>", "72")  # numbers compare as numbers by default
    assert not g.gsm8k_correct("<answer>72.0</answer>", "72", strict_string=True)
    assert not g.gsm8k_correct("<answer>5</answer>", "")  # no gold: never correct


@pytest.mark.parametrize("reward,target", [(g.gsm8k_correctness_reward, "gsm8k_correct"),
                                           (g.xml_count_reward, "xml_count_score"),
                                           (g.strict_format_reward, "strict_format_ok"),
                                           (g.soft_format_reward, "soft_format_ok"), (g.int_reward, "int_score")])
def test_a_reward_whose_scoring_raises_scores_zero_and_says_which(monkeypatch, caplog, reward, target):
    def boom(*_):
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(g, target, boom)
    with caplog.at_level(logging.WARNING, logger=g.__name__):
        assert reward(["p"], ["<answer>5</answer>"], answer=["5"]) == [0.0]
    assert f"{reward.__name__} failed" in caplog.text
    assert reward([], None, answer=[]) == []  # no completions: nothing to score


def test_a_degree_sign_ends_the_number_before_it():
    assert g.extract_gsm8k_prediction("<answer>90°5</answer>") == "5"  # not 905
    assert g.extract_gsm8k_prediction("<answer>turn 90^{\\circ}</answer>") == "90"  # a degree, not a power
    assert g.extract_gsm8k_prediction("<answer>5^2</answer>") is None  # a power: neither base nor exponent
