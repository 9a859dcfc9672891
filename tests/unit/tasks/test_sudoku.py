"""Tests for the 4x4 Sudoku task: grids, puzzle uniqueness, the split, rewards, metrics, CSV, config."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards.sudoku import (
    is_valid_solution,
)
from diffusion_rl.tasks import TASKS
from diffusion_rl.tasks.sudoku import (
    SudokuConfig,
    SudokuTask,
    all_solution_grids,
    count_solutions,
    load_sudoku_csv,
    make_puzzle,
    split_grids,
)

GRID = "3142243142131324"  # the README example's solution
PUZZLE = "3102200002100320"  # its puzzle: 8 empty cells


def _brute_force_count(puzzle: str, limit: int = 2) -> int:
    """Independent solver: fill empty cells by backtracking, checking rows/cols/boxes directly."""
    cells = list(puzzle)

    def ok(i: int, d: str) -> bool:
        r, c = divmod(i, 4)
        box = [4 * (r // 2 * 2 + a) + c // 2 * 2 + b for a in range(2) for b in range(2)]
        peers = {4 * r + k for k in range(4)} | {4 * k + c for k in range(4)} | set(box)
        return all(cells[j] != d for j in peers if j != i)

    if any(c not in "01234" for c in cells) or any(
        cells[i] != "0" and not ok(i, cells[i]) for i in range(16)
    ):
        return 0

    def solve(i: int) -> int:
        if i == 16:
            return 1
        if cells[i] != "0":
            return solve(i + 1)
        n = 0
        for d in "1234":
            if ok(i, d):
                cells[i] = d
                n += solve(i + 1)
                cells[i] = "0"
                if n >= limit:
                    break
        return n

    return min(solve(0), limit)


def _task(**kw) -> SudokuTask:
    return SudokuTask(SudokuConfig(**kw))


# ---- grids and puzzles -------------------------------------------------------------------------
def test_count_solutions_agrees_with_brute_force():
    rng = random.Random(1)
    grids = all_solution_grids()
    puzzles = ["0" * 16, PUZZLE, "1100000000000000", "5000000000000000"]
    for _ in range(300):
        g = rng.choice(grids)
        puzzles.append("".join(c if rng.random() < 0.3 else "0" for c in g))
    for p in puzzles:
        for limit in (1, 2, 5):
            assert count_solutions(p, limit) == _brute_force_count(p, limit), (p, limit)
    assert count_solutions("0" * 16, limit=1000) == 288


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_generated_puzzles_unique_and_in_range(seed):
    rng = random.Random(seed)
    grids = all_solution_grids()
    for _ in range(100):
        g = rng.choice(grids)
        p = make_puzzle(g, rng, 4, 10)
        givens = 16 - p.count("0")
        assert 4 <= givens <= 10
        assert all(c == "0" or c == s for c, s in zip(p, g, strict=True))
        assert _brute_force_count(p) == 1
        assert _brute_force_count(p, limit=1) == 1
        # The unique completion is the source grid: filling empty cells with it is the only answer.
        assert sum(all(c in ("0", x) for c, x in zip(p, h, strict=True)) for h in grids) == 1


def test_make_puzzle_stops_at_minimal_when_target_unreachable():
    rng = random.Random(0)
    p = make_puzzle(GRID, rng, 0, 0)
    assert count_solutions(p) == 1
    # Minimal: blanking any remaining given breaks uniqueness.
    for i, c in enumerate(p):
        if c != "0":
            assert count_solutions(p[:i] + "0" + p[i + 1 :]) == 2


def test_make_puzzle_full_givens_keeps_grid():
    assert make_puzzle(GRID, random.Random(0), 16, 16) == GRID


# ---- split and task items ----------------------------------------------------------------------
@pytest.mark.parametrize("seed,frac", [(0, 0.2), (7, 0.5), (3, 0.01)])
def test_split_disjoint_and_covering(seed, frac):
    train, test = split_grids(seed, frac)
    assert not set(train) & set(test)
    assert set(train) | set(test) == set(all_solution_grids())
    assert len(train) + len(test) == 288
    assert len(test) == max(1, round(frac * 288))
    assert split_grids(seed, frac) == (train, test)  # seeded
    assert split_grids(seed + 1, frac) != (train, test)


def test_task_train_test_disjoint_by_solution_grid():
    task = TASKS.get("sudoku")(SudokuConfig(num_train=500, num_test=64, seed=3))
    train, test = task.train_items(), task.test_items()
    assert len(train) == 500 and len(test) == 64
    assert not {it["solution"] for it in train} & {it["solution"] for it in test}
    assert len({it["puzzle"] for it in test}) == 64  # distinct test puzzles
    for it in train + test:
        assert count_solutions(it["puzzle"]) == 1
        assert is_valid_solution(it["solution"])
    assert task.train_items() == train  # deterministic
    assert _task(num_train=500, num_test=64, seed=4).train_items() != train


def test_task_prompt_target_and_rewards():
    task = _task()
    item = {"puzzle": PUZZLE, "solution": GRID}
    assert task.prompt(item) == "="  # the canvas holds the givens (pinned): the prompt need not repeat them
    assert _task(givens_in_prompt=True).prompt(item) == "3102200002100320="
    assert _task(pin_givens=False).prompt(item) == "3102200002100320="  # the prompt is all the model sees
    assert task.target(item) == GRID
    rewards = task.rewards([GRID, "", f"<answer>{GRID}</answer>"], [item] * 3)
    assert rewards.tolist() == [1.0, 0.0, 1.0]
    assert [name for name, _, _ in task.reward_functions()] == ["cell"]


def _write_csv(path, rows, header="Puzzle,Solution"):
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def test_data_path_excludes_csv_solutions_from_training(tmp_path):
    rng = random.Random(5)
    held = rng.sample(all_solution_grids(), 40)
    rows = [f"{make_puzzle(g, rng, 4, 8)},{g}" for g in held]
    path = _write_csv(tmp_path / "test.csv", rows)
    task = _task(data_path=str(path), num_test=30, num_train=2000)
    test = task.test_items()
    assert [it["solution"] for it in test] == held[:30]  # the CSV's first num_test rows
    train_solutions = {it["solution"] for it in task.train_items()}
    assert not train_solutions & set(held)  # all CSV solutions excluded, not only the first 30
    val = task.validation_items()
    assert set(task.train_grids()) == set(all_solution_grids()) - set(held)
    assert val and not {it["solution"] for it in val} & set(held)  # puzzles of training grids, never a CSV grid
    assert not {it["puzzle"] for it in val} & {it["puzzle"] for it in task.train_items()}


def test_task_metrics_uses_items():
    task = _task()
    m = task.metrics([GRID, "x"], [{"puzzle": PUZZLE, "solution": GRID}] * 2)
    assert m == {"cell_accuracy": 0.5, "solved_rate": 0.5, "valid_rate": 0.5}


# ---- CSV loader --------------------------------------------------------------------------------
def test_csv_loader_reads_good_file_with_bom_and_whitespace(tmp_path):
    path = tmp_path / "s.csv"
    text = "\ufeffPuzzle,Solution\r\n 3102200002100320 , 3142243142131324 \r\n\r\n0000341221434321,1234341221434321\r\n"
    path.write_bytes(text.encode("utf-8"))
    assert load_sudoku_csv(path) == [
        {"puzzle": PUZZLE, "solution": GRID},
        {"puzzle": "0000341221434321", "solution": "1234341221434321"},
    ]


@pytest.mark.parametrize(
    "bad_row",
    [
        "310220000210032,3142243142131324",
        "31022000021003x0,3142243142131324",
        "3102200002100320,3142243142131325",
        "3102200002100320",
        "4102200002100320,3142243142131324",
        "3102200002100320,3142243142131324,1",
    ],
)
def test_csv_loader_rejects_bad_row_with_line_number(tmp_path, bad_row):
    path = _write_csv(tmp_path / "bad.csv", [f"{PUZZLE},{GRID}", bad_row])
    with pytest.raises(ConfigError, match=r"task\.data_path='.*bad\.csv' is invalid: line 3: "):
        load_sudoku_csv(path)


def test_csv_loader_rejects_wrong_header(tmp_path):
    path = _write_csv(tmp_path / "h.csv", [f"{PUZZLE},{GRID}"], header="question,answer")
    with pytest.raises(ConfigError, match="line 1: expected header"):
        load_sudoku_csv(path)


def test_csv_loader_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope" / "sudoku.csv"
    with pytest.raises(ConfigError, match="nope/sudoku.csv' is invalid: no such file"):
        load_sudoku_csv(missing)
    with pytest.raises(ConfigError, match="task.data_path=.*sudoku.csv"):
        _task(data_path=str(missing)).test_items()


# ---- config ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,key",
    [
        ({"group_size": 1}, "task.group_size"),
        ({"min_givens": 8, "max_givens": 6}, "task.max_givens"),
        ({"min_givens": -1}, "task.min_givens"),
        ({"max_givens": 17}, "task.max_givens"),
        ({"num_train": 0}, "task.num_train"),
        ({"test_fraction": 1.0}, "task.test_fraction"),
    ],
)
def test_config_validation(kw, key):
    with pytest.raises(ConfigError) as err:
        _task(**kw)
    assert err.value.key == key


def test_registered_and_default_config_valid():
    assert TASKS.get("sudoku") is SudokuTask
    assert SudokuTask.config_class is SudokuConfig
    SudokuConfig().validate()


# ---- validation split and the reward's tokens ------------------------------------------------------
def test_reward_token_mask_marks_the_digits_of_empty_cells():
    task = SudokuTask(SudokuConfig())
    item = {"puzzle": PUZZLE, "solution": GRID}
    empty = [c == "0" for c in PUZZLE]
    assert task.reward_token_mask(item, list(GRID)) == empty  # a given's digit changes nothing
    # a non-digit counts (it shifts nothing, but another token there would); later cells shift with it
    mask = task.reward_token_mask(item, ["3", "x", *GRID[1:]])
    assert mask[:2] == [False, True] and mask[2:] == empty[1:]
    # the cells are those of the last <answer> block: digits in the reasoning count as text
    tokens = ["<reasoning>", "1", "2", "</reasoning>", "<answer>", *GRID, "</answer>"]
    mask = task.reward_token_mask(item, tokens)
    assert mask[:5] == [True] * 5 and mask[5:21] == empty and mask[21] is True
    # and the reward really ignores those tokens: changing a given cell's digit keeps the reward
    changed = "".join(d if e else ("4" if d != "4" else "1") for d, e in zip(GRID, empty, strict=True))
    assert task.rewards([GRID, changed], [item, item]).tolist() == [1.0, 1.0]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789 x<>/answer", max_size=40), st.sampled_from(all_solution_grids()),
       st.integers(0, 2**16 - 1))
def test_token_rewards_sum_to_the_reward(text, grid, blank_bits):
    """Per-cell credit splits the reward exactly, whatever the completion (one token per character),
    for every puzzle with an empty cell (one without scores 1 whatever is written: nothing to split)."""
    assume(blank_bits != 0)
    puzzle = "".join("0" if blank_bits >> i & 1 else c for i, c in enumerate(grid))
    item = {"puzzle": puzzle, "solution": grid}
    task = SudokuTask(SudokuConfig())
    assert sum(task.token_rewards(item, list(text))) == pytest.approx(float(task.rewards([text], [item])[0]), abs=1e-6)
