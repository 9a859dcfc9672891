"""Tests for task=multi_sudoku: several 4x4 puzzles per item, their splits, reward, per-token credit,
config errors and the canvas (its metrics: tests/unit/rewards/test_sudoku_reward.py)."""

from __future__ import annotations

import pytest

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards.sudoku import is_valid_solution
from diffusion_rl.tasks.multi_sudoku import MultiSudokuConfig, MultiSudokuTask
from diffusion_rl.tasks.sudoku import count_solutions, split_grids

# two grids side by side: the README example (8 empty cells) and another (12 empty cells)
GRID_A, PUZZLE_A = "3142243142131324", "3102200002100320"
GRID_B, PUZZLE_B = "1234341221434321", "1000040000400020"
ITEM = {"puzzle": PUZZLE_A + PUZZLE_B, "solution": GRID_A + GRID_B}


def task(**kw) -> MultiSudokuTask:
    return MultiSudokuTask(MultiSudokuConfig(**{"num_train": 40, "num_val": 16, "num_test": 16, **kw}))


def grids_of(text: str) -> list[str]:
    return [text[g:g + 16] for g in range(0, len(text), 16)]


def test_each_item_is_k_unique_puzzles_of_the_split_s_grids():
    t = task(grids=3)
    train_grids, test_grids = map(set, split_grids(0, t.cfg.test_fraction))
    splits = t.splits
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (40, 16, 16)
    for split, allowed in ((splits.train, train_grids), (splits.validation, train_grids), (splits.test, test_grids)):
        for it in split:
            assert len(it["puzzle"]) == len(it["solution"]) == 48
            for puzzle, grid in zip(grids_of(it["puzzle"]), grids_of(it["solution"]), strict=True):
                assert grid in allowed and is_valid_solution(grid)
                assert count_solutions(puzzle) == 1  # the grid is the puzzle's only solution
                assert all(p in ("0", g) for p, g in zip(puzzle, grid, strict=True))
                assert 4 <= sum(p != "0" for p in puzzle)
    train_puzzles = {p for it in splits.train for p in grids_of(it["puzzle"])}
    assert not train_puzzles & {p for it in splits.validation for p in grids_of(it["puzzle"])}
    assert splits.test == task(grids=3).splits.test  # seeded: the same items again
    assert splits.test != task(grids=3, seed=1).splits.test


def test_the_reward_is_the_share_of_all_the_item_s_empty_cells_filled_right():
    t = task(grids=2)
    wrong_b = "".join("1" if c == "0" else c for c in PUZZLE_B)  # 12 empty cells; GRID_B has a 1 at 3 (6, 9, 15)
    right_b_first_row = GRID_B[:4] + PUZZLE_B[4:]  # fills 3 of B's empty cells
    completions = [GRID_A + GRID_B, GRID_A + wrong_b, PUZZLE_A + right_b_first_row, GRID_A]
    expected = [1.0, (8 + 3) / 20, 3 / 20, 8 / 20]  # a short answer is padded with 0s: B's cells all wrong
    assert t.rewards(completions, [ITEM] * 4).tolist() == pytest.approx(expected)


def test_each_token_earns_its_share_of_the_reward_in_every_grid():
    t = task(grids=2)
    tokens = list(GRID_A + GRID_B)
    credit = t.token_rewards(ITEM, tokens)
    empty = [p == "0" for p in PUZZLE_A + PUZZLE_B]
    assert credit == pytest.approx([1 / 20 if e else 0.0 for e in empty])  # cells 16-31 earn too
    assert sum(credit) == pytest.approx(t.rewards(["".join(tokens)], [ITEM]).item())
    # a given cell of the second grid is not read: the reward mask leaves it out
    assert t.reward_token_mask(ITEM, tokens) == [e for e in empty]


def test_bad_settings_stop_with_the_key():
    for bad, key in ((dict(grids=0), "grids"), (dict(rewards="d1"), "rewards"), (dict(data_path="x.csv"), "data_path")):
        with pytest.raises(ConfigError, match=rf"^task\.{key}="):
            MultiSudokuConfig(**bad).validate()


def test_a_canvas_shorter_than_the_answer_is_refused(tiny_bundle):
    t = task(grids=2)
    tok = tiny_bundle.tokenizer
    with pytest.raises(ConfigError, match=r"^sampler\.gen_length=16 .*32 completion tokens"):
        t.canvas([ITEM], tok, 16, tiny_bundle.mask_token_id)
    canvas = t.canvas([ITEM], tok, 32, tiny_bundle.mask_token_id)  # (1, 32): the givens of both grids
    pinned = [tok.decode([int(i)]) if int(i) != tiny_bundle.mask_token_id else "0" for i in canvas[0]]
    assert "".join(pinned) == PUZZLE_A + PUZZLE_B
