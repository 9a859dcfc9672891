"""tasks/sudoku.py at its edges, each case worked out by hand: which characters of a completion the
reward reads (``answer_cells``), the config's bounds, the split's sizes, the puzzle's number of givens,
the reward presets and the per-item verdicts that the metrics and hints use."""

from __future__ import annotations

import random

import pytest

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.multi_sudoku import MultiSudokuConfig, MultiSudokuTask
from diffusion_rl.tasks.sudoku import (
    N_CELLS,
    SudokuConfig,
    SudokuTask,
    _d1_cell_reward,
    all_solution_grids,
    answer_cells,
    count_solutions,
    make_puzzle,
    split_grids,
)

GRID = "3142243142131324"
PUZZLE = "3102200002100320"  # 8 empty cells
WRONG = GRID[:2] + ("1" if GRID[2] != "1" else "2") + GRID[3:]  # cell 2, empty in PUZZLE, wrong: 7 of 8 right


# ---- answer_cells: the cells each token supplies --------------------------------------------------
def test_only_the_last_answer_block_is_read():
    tokens = ["<answer>", "12", "</answer>", "<answer>", "34", "</answer>"]
    # the first block's digits supply nothing; "34" is one token, its second digit at offset 1
    assert answer_cells(tokens) == [[], [], [], [], [(0, "3"), (1, "4")], []]


def test_the_block_starts_after_its_tag_and_ends_at_the_first_close_after_it():
    # "9" before the tag and "7" after the close are outside; the tag shares its tokens with digits
    assert answer_cells(["9<answer>1", "2</answer>7"]) == [[(0, "1")], [(1, "2")]]
    # a tag at position 0, then two closes: the block ends at the first one, "3" is outside it
    assert answer_cells(["<answer>12</answer>3</answer>"]) == [[(0, "1"), (1, "2")]]
    # an open tag without a close: the block runs to the end of the text
    assert answer_cells(["<answer>1", "2"]) == [[(0, "1")], [(1, "2")]]


def test_without_an_open_tag_the_whole_text_is_read_even_past_a_stray_close():
    assert answer_cells(["12</answer>34"]) == [[(0, "1"), (1, "2"), (2, "3"), (3, "4")]]


def test_cells_past_n_cells_are_counted_but_supply_nothing():
    assert answer_cells(["123"], n_cells=2) == [[(0, "1"), (1, "2")]]


# ---- the config's bounds, each at its edge --------------------------------------------------------
@pytest.mark.parametrize("kw", [
    {"num_train": 1},
    {"min_givens": 0, "max_givens": 0},
    {"min_givens": N_CELLS, "max_givens": N_CELLS},
    {"min_givens": 5, "max_givens": 5},
    {"test_fraction": 0.999},
])
def test_the_config_accepts_its_edges(kw):
    SudokuConfig(**kw).validate()


@pytest.mark.parametrize("kw, key", [
    ({"num_train": 0}, "task.num_train"),
    ({"min_givens": -1}, "task.min_givens"),
    ({"min_givens": N_CELLS + 1, "max_givens": N_CELLS + 1}, "task.min_givens"),
    ({"min_givens": 6, "max_givens": 5}, "task.max_givens"),
    ({"max_givens": N_CELLS + 1}, "task.max_givens"),
    ({"test_fraction": 0.0}, "task.test_fraction"),
    ({"test_fraction": 1.0}, "task.test_fraction"),
])
def test_the_config_refuses_one_past_its_edges(kw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        SudokuConfig(**kw).validate()


# ---- split and puzzles -----------------------------------------------------------------------------
def test_the_split_keeps_at_least_one_grid_on_each_side():
    train, test = split_grids(0, 0.999)  # round(0.999 * 288) = 288: one grid stays for training
    assert (len(train), len(test)) == (1, 287)
    train, test = split_grids(0, 0.001)  # round(0.288) = 0: one grid is still held out
    assert (len(train), len(test)) == (287, 1)
    assert not set(train) & set(test) and sorted(train + test) == sorted(all_solution_grids())


def test_a_puzzle_stops_at_its_target_number_of_givens():
    rng = random.Random(0)
    for grid in all_solution_grids()[:20]:
        puzzle = make_puzzle(grid, rng, 12, 12)  # 4 blanks keep one solution on every 4x4 grid tried
        assert sum(c != "0" for c in puzzle) == 12 and count_solutions(puzzle) == 1


def test_count_solutions_refuses_a_puzzle_of_digits_with_the_wrong_length():
    with pytest.raises(ValueError):
        count_solutions("123")
    with pytest.raises(ValueError):
        count_solutions("a" * N_CELLS)


# ---- the task's verdicts and presets ---------------------------------------------------------------
def test_correctness_is_the_cell_reward_at_one_and_pairs_completions_with_items():
    task = SudokuTask(SudokuConfig(num_train=8))
    item = {"puzzle": PUZZLE, "solution": GRID}
    assert task.correctness([GRID, f"<answer>{GRID}</answer>", WRONG], [item] * 3) == [True, True, False]
    with pytest.raises(ValueError):
        task.correctness([GRID, GRID], [item])


def test_correctness_reads_every_cell_of_a_multi_grid_item():
    task = MultiSudokuTask(MultiSudokuConfig(grids=2, num_train=8, num_val=4, num_test=4))
    item = {"puzzle": PUZZLE * 2, "solution": GRID * 2}
    wrong_second = GRID + WRONG
    assert task.correctness([GRID * 2, wrong_second], [item, item]) == [True, False]


def test_pinned_completion_and_hint_reference_are_the_givens_and_the_solution():
    task = SudokuTask(SudokuConfig(num_train=8, pin_givens=True))
    item = {"puzzle": PUZZLE, "solution": GRID}
    assert task.pinned_completion(item) == [None if c == "0" else c for c in "3102200002100320"]
    assert task.pinned_completion(item)[:4] == ["3", "1", None, "2"]
    assert task.hint_reference(item) == list("3142243142131324")
    assert SudokuTask(SudokuConfig(num_train=8, pin_givens=False)).pinned_completion(item) is None


def test_the_reward_presets_name_their_function_and_weight():
    assert SudokuTask(SudokuConfig(num_train=8, rewards="d1")).reward_functions() == [("d1_cell", _d1_cell_reward, 1.0)]
    for preset in ("auto", "d1_fixed", "plain"):
        (name, _, weight), = SudokuTask(SudokuConfig(num_train=8, rewards=preset)).reward_functions()
        assert (name, weight) == ("cell", 1.0)


def test_d1s_reward_scores_a_bare_grid_as_if_tagged_and_a_tagged_text_as_it_is():
    fields = {"puzzle": [PUZZLE] * 3, "solution": [GRID] * 3}
    # d1 reads the last closed <answer> block: a bare grid is wrapped in one; a text with an open tag
    # is left as it is, so an answer never closed scores 0 (wrapped again, it would read the grid)
    got = _d1_cell_reward(["p"] * 3, [GRID, WRONG, f"<answer>{GRID}"], **fields)
    assert got == [1.0, 7 / 8, 0.0]


def test_validation_puzzles_are_the_validation_stream_of_the_training_grids():
    # each held-out set draws from its own named stream ("sudoku/<split>/<seed>"), so the validation set of
    # a seed is the same puzzles whatever the other splits draw; none is a training or test puzzle
    task = SudokuTask(SudokuConfig(num_train=64, num_val=16, num_test=16, seed=5))
    exclude = {it["puzzle"] for it in task.train_items()} | {it["puzzle"] for it in task.test_items()}
    rng = random.Random("sudoku/validation/5")
    want: dict[str, str] = {}
    grids = task.train_grids()
    while len(want) < 16:
        grid = rng.choice(grids)
        puzzle = make_puzzle(grid, rng, 4, 10)
        if puzzle not in exclude:
            want.setdefault(puzzle, grid)
    assert task.validation_items() == [{"puzzle": p, "solution": g} for p, g in want.items()]


# ---- multi_sudoku's own rules ----------------------------------------------------------------------
def test_one_grid_is_a_valid_multi_sudoku_item():
    MultiSudokuConfig(grids=1).validate()
    with pytest.raises(ConfigError, match=r"task\.grids"):
        MultiSudokuConfig(grids=0).validate()


def test_multi_sudoku_validation_avoids_every_training_puzzle_even_where_they_crowd():
    # one blank a puzzle: 16 puzzles per grid, so 200 items x 2 puzzles cover ~1 in 9 of the puzzles of
    # the training grids, and 32 validation puzzles drawn blind would meet some of them
    cfg = {"grids": 2, "min_givens": 15, "max_givens": 15, "num_train": 200, "num_val": 16, "num_test": 4, "seed": 1}
    task = MultiSudokuTask(MultiSudokuConfig(**cfg))
    train = {it["puzzle"][g:g + N_CELLS] for it in task.train_items() for g in (0, N_CELLS)}
    val = task.validation_items()
    assert len(val) == 16
    assert not {it["puzzle"][g:g + N_CELLS] for it in val for g in (0, N_CELLS)} & train
    assert MultiSudokuTask(MultiSudokuConfig(**cfg)).validation_items() == val  # a seeded stream
