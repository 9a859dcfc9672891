"""Several 4x4 Sudoku puzzles answered in one completion: the long-completion testbed.

An item is ``task.grids`` puzzles side by side (default 8): the puzzle and the solution are
``16 * grids``-character strings, grid after grid, and the answer is one completion of ``16 * grids``
cells (128 tokens by default, ``conf/sampler/multi_sudoku.yaml``). Each grid is a puzzle of
``task=sudoku`` (same generator, same givens range, the same split of the 288 solution grids: every
test item is made of held-out grids only), so the difficulty per token is Sudoku's and what changes
is the completion's length. That is the variable this task isolates: how the importance ratios of a
sequence-level likelihood (StableDRL's ELBO ratio) behave when the completion holds many tokens.

Reward (``task.rewards``): the share of the item's empty cells, over all its grids, filled with the
solution's digit. With ``task.pin_givens`` (default) the givens start in the sampler's canvas and
are never sampled or scored, as in ``task=sudoku``. Metrics: ``rewards/sudoku.py: grids_metrics``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards.sudoku import N_CELLS, grids_metrics
from diffusion_rl.tasks.base import TASKS
from diffusion_rl.tasks.sudoku import SudokuConfig, SudokuTask, make_puzzle, split_grids


@dataclass
class MultiSudokuConfig(SudokuConfig):
    name: str = "multi_sudoku"
    grids: int = 8  # puzzles per item: the completion holds 16 * grids cells
    num_train: int = 2048  # generated training items (each of `grids` puzzles)
    eval_batch_size: int = 64

    def validate(self) -> None:
        super().validate()
        if self.grids < 1:
            raise ConfigError("task.grids", self.grids, "must be >= 1")
        if self.rewards == "d1":
            raise ConfigError("task.rewards", self.rewards, "d1's reward reads one grid; allowed: auto, d1_fixed, plain")
        if self.data_path:
            raise ConfigError("task.data_path", self.data_path,
                              "task=multi_sudoku generates its items; a CSV of single puzzles is task=sudoku's")


@TASKS.register("multi_sudoku")
class MultiSudokuTask(SudokuTask):
    """``task.grids`` 4x4 Sudoku puzzles per item; items are ``{"puzzle": str, "solution": str}`` of
    ``16 * grids`` characters each."""

    config_class = MultiSudokuConfig
    cfg: MultiSudokuConfig
    metric_help = {
        "cell_accuracy": "share of each item's empty cells (all its grids) filled with the reference digit, "
                         "averaged over items",
        "solved_rate": "share of items whose every grid has all its empty cells right",
        "grid_solved_rate": "share of grids (over all items) whose empty cells all match the reference",
        "grid_valid_rate": "share of grids (over all items) answered with a valid grid that keeps every given",
    }

    def _items(self, grids: list[str], n: int, rng: random.Random,
               exclude: frozenset[str] | set[str] = frozenset()) -> list[dict[str, Any]]:
        """``n`` items of ``cfg.grids`` puzzles each, every puzzle from ``grids`` and none in ``exclude``."""
        cfg, items = self.cfg, []
        for _ in range(n):
            puzzles: list[str] = []
            solutions: list[str] = []
            for _ in range(50 * cfg.grids):
                if len(puzzles) == cfg.grids:
                    break
                grid = rng.choice(grids)
                puzzle = make_puzzle(grid, rng, cfg.min_givens, cfg.max_givens)
                if puzzle not in exclude:
                    puzzles.append(puzzle)
                    solutions.append(grid)
            if len(puzzles) < cfg.grids:
                raise ConfigError("task.min_givens", cfg.min_givens,
                                  "too few distinct puzzles in this givens range for a held-out split")
            items.append({"puzzle": "".join(puzzles), "solution": "".join(solutions)})
        return items

    @functools.cached_property
    def _train_pool(self) -> list[dict[str, Any]]:
        return self._items(self.train_grids(), self.cfg.num_train, random.Random(f"multi_sudoku/train/{self.cfg.seed}"))

    @functools.cached_property
    def _test_set(self) -> list[dict[str, Any]]:
        test_grids = split_grids(self.cfg.seed, self.cfg.test_fraction)[1]
        return self._items(test_grids, self.cfg.generated_num_test, random.Random(f"multi_sudoku/test/{self.cfg.seed}"))

    def validation_items(self) -> list[dict[str, Any]]:
        """Items of the training grids whose puzzles are no training item's (the test set holds out whole grids)."""
        seen = {it["puzzle"][g:g + N_CELLS] for it in self._train_pool for g in range(0, len(it["puzzle"]), N_CELLS)}
        rng = random.Random(f"multi_sudoku/validation/{self.cfg.seed}")
        return self._items(self.train_grids(), self.cfg.num_val, rng, seen)

    def canvas(self, items: Sequence[dict[str, Any]], tokenizer: Any, length: int, mask_id: int) -> torch.Tensor | None:
        """As :meth:`Task.canvas`; a completion too short for the item's cells is refused, not cut."""
        if length < N_CELLS * self.cfg.grids:
            raise ConfigError("sampler.gen_length", length,
                              f"task.grids={self.cfg.grids} needs {N_CELLS * self.cfg.grids} completion tokens "
                              "(conf/sampler/multi_sudoku.yaml holds 8 grids)")
        return super().canvas(items, tokenizer, length, mask_id)

    def metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        return grids_metrics(completions, [it["puzzle"] for it in items], [it["solution"] for it in items])
