"""4x4 Sudoku reward and metrics (docs/methods.md §5): a plain TRL-style reward function and the
evaluation metrics.

Grids are 16-character row-major strings of digits 1-4; a puzzle uses ``0`` for an empty cell. The
answer is the ASCII digits of the last ``<answer>`` block (else the whole completion), truncated or
padded with ``0`` to 16 cells. The reward counts only the puzzle's empty cells.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import islice
from typing import Any

from diffusion_rl.rewards.answer import extract_answer
from diffusion_rl.rewards.prompted import answer_block

N_CELLS = 16
DIGITS = "0123456789"  # ASCII only: str.isdigit would also accept "３" or "٣"
_DIGIT_RE = re.compile("[0-9]")
SYMBOLS = "1234"
# Every row, column and 2x2 box as a tuple of cell indices.
UNITS: tuple[tuple[int, ...], ...] = (
    tuple(tuple(4 * r + c for c in range(4)) for r in range(4))
    + tuple(tuple(4 * r + c for r in range(4)) for c in range(4))
    + tuple(
        tuple(4 * (br + r) + bc + c for r in range(2) for c in range(2))
        for br in (0, 2)
        for bc in (0, 2)
    )
)


def is_valid_solution(grid: str) -> bool:
    """True when ``grid`` is 16 digits 1-4 with every row, column and box a permutation of 1-4."""
    if not isinstance(grid, str) or len(grid) != N_CELLS or any(c not in SYMBOLS for c in grid):
        return False
    return all(len({grid[i] for i in unit}) == 4 for unit in UNITS)


# ---- answers, reward, metrics --- -------------------------------------------------------------------
def parse_answer(completion: Any, n_cells: int = N_CELLS) -> str:
    """The answer's ASCII digits, truncated / padded with ``0`` to ``n_cells`` characters (16: one grid)."""
    if isinstance(completion, str) and "<reasoning>" in completion and answer_block(completion) is None:
        return "0" * n_cells  # a chat response cut off before its answer
    answer = extract_answer(completion)
    # the first n_cells digits: the regex skips non-digits in C, so a huge answer costs a scan, not a loop
    digits = "".join(m.group() for m in islice(_DIGIT_RE.finditer(answer), n_cells))
    return digits.ljust(n_cells, "0")


def cell_score(answer: str, puzzle: str, solution: str) -> float:
    """The share of the puzzle's empty cells that ``answer`` (16 cells, :func:`parse_answer`) fills with
    the solution's digit; a grid of another length is refused (ValueError), not scored on a part."""
    empty = [(a, s) for a, p, s in zip(answer, puzzle, solution, strict=True) if p == "0"]
    if not empty:
        return 1.0  # nothing to fill: every empty cell is trivially right
    return sum(a == s for a, s in empty) / len(empty)


def keeps_givens(answer: str, puzzle: str) -> bool:
    return all(p == "0" or a == p for a, p in zip(answer, puzzle, strict=True))


def sudoku_cell_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    puzzle: Sequence[str],
    solution: Sequence[str],
    **_: Any,
) -> list[float]:
    """Fraction of the puzzle's empty cells that the answer fills with the reference digit. A puzzle of
    several grids side by side (``task=multi_sudoku``: ``16 * k`` cells) reads ``16 * k`` answer digits."""
    return [
        cell_score(parse_answer(c, len(p)), p, s)
        for c, p, s in zip(completions, puzzle, solution, strict=True)
    ]


def sudoku_metrics(
    completions: Sequence[str], puzzles: Sequence[str], solutions: Sequence[str]
) -> dict[str, float]:
    """``cell_accuracy``, ``solved_rate`` (all empty cells match the reference) and ``valid_rate``
    (a correct grid keeping every given: the honest metric on puzzles with several solutions):
    :func:`grids_metrics` of one-grid items."""
    m = grids_metrics(completions, puzzles, solutions)
    return {"cell_accuracy": m["cell_accuracy"], "solved_rate": m["solved_rate"], "valid_rate": m["grid_valid_rate"]}


def grids_metrics(
    completions: Sequence[str], puzzles: Sequence[str], solutions: Sequence[str]
) -> dict[str, float]:
    """Metrics of items that are ``k`` grids side by side (``16 * k`` cells; ``task=multi_sudoku``):
    ``cell_accuracy`` over each item's empty cells, ``grid_solved_rate`` and ``grid_valid_rate`` over
    every grid of every item, ``solved_rate`` over items (every grid of the item solved)."""
    cell = solved = grids = grid_solved = grid_valid = 0.0
    for c, p, s in zip(completions, puzzles, solutions, strict=True):
        answer = parse_answer(c, len(p))
        score = cell_score(answer, p, s)
        cell += score
        solved += score == 1.0
        for g in range(0, len(p), N_CELLS):
            a, q, r = answer[g:g + N_CELLS], p[g:g + N_CELLS], s[g:g + N_CELLS]
            grids += 1
            grid_solved += cell_score(a, q, r) == 1.0
            grid_valid += is_valid_solution(a) and keeps_givens(a, q)
    n, m = max(len(completions), 1), max(grids, 1)
    return {"cell_accuracy": cell / n, "solved_rate": solved / n, "grid_solved_rate": grid_solved / m,
            "grid_valid_rate": grid_valid / m}
