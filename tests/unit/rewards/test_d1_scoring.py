"""``eval.protocol=d1`` (rewards/d1/scoring.py) function by function: what each scorer returns for
an item (the answer it read, its points, out of how many), d1's item builders from its generation
records, and the pooled metric. Each case is worked out by hand from d1's parsers
(``eval/parse_and_get_acc.py``) as the module docstring states them.

Run: pytest tests/unit/rewards/test_d1_scoring.py -q
"""

from __future__ import annotations

import pytest

from diffusion_rl.rewards.d1.scoring import (
    D1_PROTOCOLS,
    d1_countdown_correct,
    d1_countdown_expression,
    d1_gsm8k_prediction,
    d1_score,
    first_answer_block,
)

GRID = "4321124334122134"
PUZZLE = "4320004330100004"  # 8 empty cells: 3, 4, 5, 8, 9, 11, 13, 14


def _d1(task: str, completion: str, item: dict) -> tuple[str, float, int]:
    return D1_PROTOCOLS[task].score(completion, item)


def test_first_answer_block():
    assert first_answer_block("<answer>1</answer><answer>2</answer>") == "1"  # the first
    assert first_answer_block("x</answer> <answer>1</answer>") == "1"  # closed after it opens
    assert first_answer_block("<answer>1") is None and first_answer_block("1</answer>") is None


# ---- GSM8K ---------------------------------------------------------------------------------------
def test_gsm8k_answer_block_numbers():
    assert d1_gsm8k_prediction("<answer>1, 2 and 3</answer>") == 3.0  # not a float: the last number
    assert d1_gsm8k_prediction("<answer>about 1.5 or 2.</answer>") == 2.0
    assert d1_gsm8k_prediction("<answer>-4</answer>") == -4.0  # float reads it whole
    assert d1_gsm8k_prediction("<answer>no number</answer>") is None
    assert d1_gsm8k_prediction("<answer>  </answer>") is None  # a blank block
    assert d1_gsm8k_prediction("\\boxed{x} <answer>7</answer>") == 7.0  # a box without a number: the block


def test_gsm8k_scores_one_point_per_item_and_names_the_answer():
    item = {"answer": "#### 14"}
    assert _d1("gsm8k", "\\boxed{14.0}", item) == ("14.0", 1.0, 1)  # the answer is the float's repr
    assert _d1("gsm8k", "\\boxed{15}", item) == ("15.0", 0.0, 1)
    assert _d1("gsm8k", "no answer", item) == ("", 0.0, 1)
    # no prediction and an unreadable (negative) gold: both None, still wrong
    assert _d1("gsm8k", "no answer", {"answer": "#### -3"}) == ("", 0.0, 1)
    assert _d1("gsm8k", "\\boxed{14}", {}) == ("14.0", 0.0, 1)  # no gold


# ---- MATH500 -------------------------------------------------------------------------------------
def test_math_scores_one_point_per_item_and_names_the_answer():
    assert _d1("math500", "so \\boxed{\\frac12}", {"answer": "0.5"}) == ("\\frac12", 1.0, 1)
    assert _d1("math500", "so \\boxed{3}", {"answer": "0.5"}) == ("3", 0.0, 1)
    # an unclosed box and no answer block: no prediction, whatever the gold
    assert _d1("math500", "so \\boxed{5", {"answer": "5"}) == ("", 0.0, 1)
    assert _d1("math500", "so \\boxed{5", {}) == ("", 0.0, 1)


# ---- Countdown -----------------------------------------------------------------------------------
def test_countdown_latex_operators_become_pythons():
    assert d1_countdown_expression("\\boxed{8 \\div 4 \\times 3 \\cdot 2}") == "8 / 4 * 3 * 2"
    assert _d1("countdown", "\\boxed{8 \\div 4 \\times 3 \\cdot 2}", {"numbers": [8, 4, 3, 2], "target": 12}) == (
        "8 / 4 * 3 * 2", 1.0, 1)


def test_countdown_tolerance_is_strict():
    # 1/100000 is the double nearest 1e-5, TOLERANCE itself: |value - 0| < 1e-5 fails by nothing
    assert not d1_countdown_correct("1/100000", [1, 100000], 0)
    assert d1_countdown_correct("1/100000", [1, 100000], 1e-5)
    assert d1_countdown_correct("1/3", [1, 3], 0.33333)  # 3.3e-6 off
    assert not d1_countdown_correct("1/3", [1, 3], 0.3333)  # 3.3e-5 off
    assert not d1_countdown_correct("2 - 1 +", [2, 1], 1)  # uses the numbers, no value
    assert not d1_countdown_correct("2 - 1", [2, 1, 1], 1)  # a number unused


def test_countdown_scores_one_point_per_item():
    item = {"numbers": [49, 55, 53], "target": 51}
    assert _d1("countdown", "\\boxed{49 + 55 - 53}", item) == ("49 + 55 - 53", 1.0, 1)
    assert _d1("countdown", "\\boxed{49 + 55 + 53}", item) == ("49 + 55 + 53", 0.0, 1)


# ---- Sudoku --------------------------------------------------------------------------------------
def test_sudoku_scores_the_empty_cells():
    item = {"puzzle": PUZZLE, "solution": GRID}
    assert _d1("sudoku", f"<answer>{GRID}</answer>", item) == (GRID, 8.0, 8)
    assert _d1("sudoku", "no grid here", item) == ("", 0.0, 8)  # nothing read: none right, all counted
    # a short grid is padded with "0" on the right: its first cells stay in place
    assert _d1("sudoku", "<answer>4321</answer>", {"puzzle": "0" * 16, "solution": GRID}) == (
        "4321" + "0" * 12, 4.0, 16)
    # a long one is cut to 16 cells
    assert _d1("sudoku", f"<answer>{GRID}99</answer>", item) == (GRID, 8.0, 8)


# ---- d1's generation records -> our items -------------------------------------------------------
def test_gsm8k_item_from_d1s_float_gold():
    item = D1_PROTOCOLS["gsm8k"].item
    assert item("q", 18.0) == {"question": "q", "answer": "#### 18"}  # "#### 18" reads back as 18.0
    assert item("q", 18) == {"question": "q", "answer": "#### 18"}
    assert item("q", 2.5) == {"question": "q", "answer": "#### 2.5"}
    assert item("q", None) == {"question": "q", "answer": ""}  # d1 could not read a gold


def test_sudoku_item_reads_the_puzzle_from_the_question():
    item = D1_PROTOCOLS["sudoku"].item
    assert item(PUZZLE, GRID) == {"puzzle": PUZZLE, "solution": GRID}  # exactly 16 digits
    assert item(PUZZLE + "\nSolve it.", int(GRID)) == {"puzzle": PUZZLE, "solution": GRID}
    assert item(f"Solve this. Sudoku puzzle: {PUZZLE}. Go", GRID) == {"puzzle": PUZZLE, "solution": GRID}
    for question in ("1234", "Solve this sudoku puzzle: " + PUZZLE, "Sudoku puzzle: 123"):
        with pytest.raises(ValueError):
            item(question, GRID)


def test_countdown_item_from_d1s_pair():
    assert D1_PROTOCOLS["countdown"].item("q", (["49", "55", "53"], "51")) == {"numbers": [49, 55, 53], "target": 51}


def test_math500_item_keeps_the_problem_and_the_gold_as_text():
    assert D1_PROTOCOLS["math500"].item("p", 0.5) == {"problem": "p", "answer": "0.5"}


# ---- the metric ----------------------------------------------------------------------------------
def test_d1_score_is_points_over_out_of():
    items = [{"answer": "#### 1"}, {"answer": "#### 2"}, {"answer": "#### 3"}]
    scored, metric = d1_score("gsm8k", ["\\boxed{1}", "\\boxed{2}", "\\boxed{4}"], items)
    assert [s[1:] for s in scored] == [(1.0, 1), (1.0, 1), (0.0, 1)] and metric == {"accuracy": 2 / 3}
    assert d1_score("gsm8k", [], []) == ([], {"accuracy": 0.0})  # nothing to score
    # a puzzle without empty cells counts for nothing
    assert d1_score("sudoku", [GRID], [{"puzzle": GRID, "solution": GRID}])[1] == {"cell_accuracy": 0.0}


def test_d1_score_reads_a_non_text_completion_as_empty():
    assert d1_score("math500", [None], [{"answer": "5"}]) == ([("", 0.0, 1)], {"accuracy": 0.0})
    assert d1_score("gsm8k", [None], [{"answer": "#### 5"}])[0] == [("", 0.0, 1)]


def test_d1_score_refuses_completions_and_items_of_different_counts():
    with pytest.raises(ValueError):
        d1_score("gsm8k", ["\\boxed{1}", "\\boxed{2}"], [{"answer": "#### 1"}])
