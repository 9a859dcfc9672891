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
def parse_answer(completion: Any) -> str:
    """The answer's ASCII digits, truncated / padded with ``0`` to 16 characters."""
    if isinstance(completion, str) and "<reasoning>" in completion and answer_block(completion) is None:
        return "0" * N_CELLS  # a chat response cut off before its answer
    answer = extract_answer(completion)
    # the first 16 digits: the regex skips non-digits in C, so a huge answer costs a scan, not a loop
    digits = "".join(m.group() for m in islice(_DIGIT_RE.finditer(answer), N_CELLS))
    return digits.ljust(N_CELLS, "0")


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
    """Fraction of the puzzle's empty cells that the answer fills with the reference digit."""
    return [
        cell_score(parse_answer(c), p, s)
        for c, p, s in zip(completions, puzzle, solution, strict=True)
    ]


def sudoku_metrics(
    completions: Sequence[str], puzzles: Sequence[str], solutions: Sequence[str]
) -> dict[str, float]:
    """``cell_accuracy``, ``solved_rate`` (all empty cells match the reference) and ``valid_rate``
    (a correct grid keeping every given: the honest metric on puzzles with several solutions)."""
    cell = solved = valid = 0.0
    for c, p, s in zip(completions, puzzles, solutions, strict=True):
        answer = parse_answer(c)
        score = cell_score(answer, p, s)
        cell += score
        solved += score == 1.0
        valid += is_valid_solution(answer) and keeps_givens(answer, p)
    n = max(len(completions), 1)
    return {"cell_accuracy": cell / n, "solved_rate": solved / n, "valid_rate": valid / n}
