"""The 4x4 Sudoku reward and metrics (rewards/sudoku.py) on hand-built answers: which grids are
solutions, how an answer is read from a completion, the share of empty cells filled right, the
three evaluation metrics, and the same for answers of several grids side by side (task=multi_sudoku)."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffusion_rl.rewards.sudoku import (
    cell_score,
    grids_metrics,
    is_valid_solution,
    keeps_givens,
    parse_answer,
    sudoku_cell_reward,
    sudoku_metrics,
)
from diffusion_rl.tasks.sudoku import all_solution_grids, count_solutions

GRID = "3142243142131324"  # the README example's solution
PUZZLE = "3102200002100320"  # its puzzle: 8 empty cells


# ---- grids -------------------------------------------------------------------------------------
def test_exactly_288_distinct_valid_grids():
    grids = all_solution_grids()
    assert len(grids) == 288
    assert len(set(grids)) == 288
    assert all(is_valid_solution(g) for g in grids)
    assert grids == sorted(grids)  # deterministic order
    # Brute force over all row permutations agrees on the set.
    rows = ["".join(p) for p in itertools.permutations("1234")]
    brute = {"".join(r) for r in itertools.product(rows, repeat=4) if is_valid_solution("".join(r))}
    assert brute == set(grids)


@pytest.mark.parametrize(
    "grid",
    [
        "1234123412341234",
        "314224314213132",
        "31422431421313244",
        "3142243142131325",
        "314224314213132x",
        "0142243142131324",
    ],
)
def test_invalid_grids_rejected(grid):
    assert not is_valid_solution(grid)


# ---- answer parsing and reward -----------------------------------------------------------------
def _reward(completion, puzzle=PUZZLE, solution=GRID) -> float:
    return sudoku_cell_reward(["p"], [completion], puzzle=[puzzle], solution=[solution])[0]


def test_reward_hand_built_cases():
    puzzle, solution = "1234341221430000", "1234341221434321"
    assert _reward("1234341221434321", puzzle, solution) == 1.0
    assert _reward("1234341221434300", puzzle, solution) == 0.5  # 2 of 4 empty cells right
    assert _reward("0000000000004000", puzzle, solution) == 0.25  # givens need not be repeated
    assert _reward("1234341221431234", puzzle, solution) == 0.0
    assert _reward("anything", solution, solution) == 1.0  # no empty cell
    # README example: 8 empty cells (2, 5, 6, 7, 8, 11, 12, 15); this answer fills 2 and 5 right.
    answer = "3142" + "2400" + "0000" + "0000"
    assert _reward(answer) == pytest.approx(2 / 8)


def test_reward_adversarial_strings():
    full = 1.0
    assert _reward("") == 0.0
    assert _reward("no tags, no digits") == 0.0
    assert _reward(GRID) == full  # no tags: the whole completion
    assert _reward(f"reasoning 9 9 <answer>{GRID}</answer>") == full
    assert _reward(" ".join(GRID)) == full  # non-digits dropped
    assert _reward("3,1,4,2|2,4,3,1\n4,2,1,3;1,3,2,4") == full
    assert (
        _reward("３１４２２４３１４２１３１３２４") == 0.0
    )  # full-width digits are not digits here
    assert _reward("٣١٤٢٢٤٣١٤٢١٣١٣٢٤") == 0.0  # Arabic-Indic digits
    assert _reward("３" + GRID) == full  # a unicode digit is dropped, not counted
    assert _reward(f"<answer>0000000000000000</answer><answer>{GRID}</answer>") == full
    assert _reward(f"<answer>{GRID}</answer>" * 1000 + "<answer>0000000000000000</answer>") == 0.0
    assert _reward(f"<answer>1111</answer> <answer>{GRID}") == full  # unterminated last block
    assert _reward(GRID + "9999") == full  # truncated to 16
    assert _reward(None) == 0.0  # type: ignore[arg-type]


def test_reward_bounded_time_on_huge_strings():
    # a generous bound that a loaded 2-core machine meets; a quadratic scan of 1 MB would take minutes
    for huge in ("x" * 10**6, "7" * 10**6, "<answer>" * 125_000, "９" * 10**6, GRID + "a" * 10**6):
        start = time.perf_counter()
        value = _reward(huge)
        assert time.perf_counter() - start < 10.0
        assert 0.0 <= value <= 1.0
    assert _reward("a" * 10**6 + GRID) == 1.0


@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from(all_solution_grids()), st.integers(0, 2**16 - 1))
def test_reward_never_raises_and_in_unit_interval(text, grid, blank_bits):
    puzzle = "".join("0" if blank_bits >> i & 1 else c for i, c in enumerate(grid))
    value = _reward(text, puzzle, grid)
    assert 0.0 <= value <= 1.0
    assert len(parse_answer(text)) == 16
    assert set(parse_answer(text)) <= set("0123456789")


# ---- metrics -----------------------------------------------------------------------------------
def test_valid_rate_accepts_alternative_solution():
    puzzle = "0" * 8 + GRID[8:]  # the top half is ambiguous
    alternatives = [g for g in all_solution_grids() if g[8:] == GRID[8:] and g != GRID]
    assert count_solutions(puzzle) == 2 and len(alternatives) >= 1
    alt = alternatives[0]
    broken = alt[:8] + ("1" if alt[8] != "1" else "2") + alt[9:]  # breaks a given
    m = sudoku_metrics([alt, GRID, broken, ""], [puzzle] * 4, [GRID] * 4)
    assert m["valid_rate"] == 0.5  # alt and GRID
    assert m["solved_rate"] == 0.25  # only GRID matches the reference
    expected_alt = sum(a == s for a, s in zip(alt[:8], GRID[:8], strict=True)) / 8
    assert m["cell_accuracy"] == pytest.approx((expected_alt + 1.0 + expected_alt + 0.0) / 4)
    assert sudoku_metrics([], [], []) == {
        "cell_accuracy": 0.0,
        "solved_rate": 0.0,
        "valid_rate": 0.0,
    }


def test_a_grid_is_a_solution_only_with_every_unit_a_permutation_of_1_to_4():
    assert is_valid_solution(GRID)
    swapped = GRID[1] + GRID[0] + GRID[2:]  # rows stay permutations; two columns break
    assert not is_valid_solution(swapped)
    assert not is_valid_solution(None)  # type: ignore[arg-type]
    assert not is_valid_solution(list(GRID))  # type: ignore[arg-type]  # 16 symbols, not a string
    assert not is_valid_solution("1234" * 4)  # rows fine, columns all equal


def test_the_answer_is_the_first_16_ascii_digits_padded_with_zeros_on_the_right():
    parse = parse_answer
    assert parse("<answer>3142</answer>") == "3142" + "0" * 12
    assert parse("12345678901234567890") == "1234567890123456"
    assert parse("<reasoning>thinking, cut off before the answer 3142") == "0" * 16
    assert parse(f"<reasoning>x</reasoning><answer>{GRID}</answer>") == GRID


def test_cell_score_counts_the_empty_cells_of_the_puzzle_only():
    puzzle, solution = "1000" + "0" * 12, "1234341221434321"
    assert cell_score(solution, puzzle, solution) == 1.0
    assert cell_score("2" + solution[1:], puzzle, solution) == 1.0  # a wrong given is not scored
    assert cell_score("1" + "0" * 15, puzzle, solution) == 0.0
    assert cell_score(solution[:4] + "0" * 12, puzzle, solution) == pytest.approx(3 / 15)
    assert cell_score("9" * 16, solution, solution) == 1.0  # no empty cell: trivially right
    with pytest.raises(ValueError):  # answers are parsed to 16 cells: a shorter one is not scored on a part
        cell_score("12", puzzle, solution)


def test_keeps_givens_needs_every_given_digit_in_place():
    assert keeps_givens(GRID, PUZZLE)
    assert keeps_givens(PUZZLE, PUZZLE)  # the empty cells are free
    given_at = PUZZLE.index("1")
    assert not keeps_givens(GRID[:given_at] + "4" + GRID[given_at + 1:], PUZZLE)
    with pytest.raises(ValueError):  # answers are parsed to 16 cells: a shorter one is a bug upstream
        keeps_givens(GRID[:15], PUZZLE)


def test_rewards_and_metrics_of_several_completions_hand_computed():
    puzzle, solution = "1234341221430000", "1234341221434321"
    completions = [solution, "1234341221434300", "nothing", "1234341221431234"]
    assert sudoku_cell_reward(["p"] * 4, completions, puzzle=[puzzle] * 4, solution=[solution] * 4) == \
        [1.0, 0.5, 0.0, 0.0]
    m = sudoku_metrics(completions, [puzzle] * 4, [solution] * 4)
    assert m == {"cell_accuracy": pytest.approx(1.5 / 4), "solved_rate": 0.25, "valid_rate": 0.25}
    with pytest.raises(ValueError):  # a missing puzzle or solution is an error, not a shorter score
        sudoku_cell_reward(["p"] * 2, completions[:2], puzzle=[puzzle], solution=[solution] * 2)
    with pytest.raises(ValueError):
        sudoku_metrics(completions, [puzzle] * 3, [solution] * 4)


# ---- several grids side by side (task=multi_sudoku) -----------------------------------------------
GRID_B, PUZZLE_B = "1234341221434321", "1000040000400020"  # 12 empty cells


def test_an_answer_of_k_grids_reads_16_k_digits():
    assert parse_answer("<answer>" + GRID + " " + GRID_B + "9</answer>", 32) == GRID + GRID_B  # the 33rd is cut
    assert parse_answer(GRID + "12", 32) == GRID + "12" + "0" * 14
    assert parse_answer("<reasoning>cut off", 32) == "0" * 32
    # the reward of a two-grid puzzle reads both grids: B's 12 empty cells count
    assert sudoku_cell_reward(["="], [GRID + GRID_B], [PUZZLE + PUZZLE_B], [GRID + GRID_B]) == [1.0]
    assert sudoku_cell_reward(["="], [GRID], [PUZZLE + PUZZLE_B], [GRID + GRID_B]) == [pytest.approx(8 / 20)]


def test_metrics_of_k_grids_count_items_and_grids_apart():
    items = [(PUZZLE + PUZZLE_B, GRID + GRID_B)] * 2
    bad_b = GRID_B[:15] + "3"  # its last cell (empty in PUZZLE_B) wrong, and not a valid grid
    given_broken = "4" + GRID[1:]  # rewrites a given (cell 0 holds a 3): its empty cells are right, it is not valid
    m = grids_metrics([GRID + GRID_B, given_broken + bad_b], [p for p, _ in items], [s for _, s in items])
    assert m["cell_accuracy"] == pytest.approx((1.0 + 19 / 20) / 2)
    assert m["solved_rate"] == pytest.approx(1 / 2)
    assert m["grid_solved_rate"] == pytest.approx(3 / 4)
    assert m["grid_valid_rate"] == pytest.approx(2 / 4)
    # one item of one grid, solved: every rate is 1 (each share is over that one item and that one grid)
    assert grids_metrics([GRID], [PUZZLE], [GRID]) == {"cell_accuracy": 1.0, "solved_rate": 1.0,
                                                       "grid_solved_rate": 1.0, "grid_valid_rate": 1.0}
    assert grids_metrics([], [], []) == {"cell_accuracy": 0.0, "solved_rate": 0.0, "grid_solved_rate": 0.0,
                                         "grid_valid_rate": 0.0}
    with pytest.raises(ValueError):  # a completion without its item is refused, not scored on a part
        grids_metrics([GRID, GRID], [PUZZLE], [GRID])
