"""task=multi_sudoku through a whole tiny run: two grids (32-token answers), StableDRL in its public regime."""

import csv
import json
import math

import pytest
from omegaconf import OmegaConf

from diffusion_rl.app.train import build_task, train
from diffusion_rl.rewards.sudoku import cell_score, parse_answer
from tests.helpers.common import compose_cfg


def test_a_two_grid_run_keeps_every_given_and_scores_both_grids(tmp_path):
    # the puzzle in the prompt too (task.givens_in_prompt), so each logged sample says which item it answered
    cfg = compose_cfg(["task=multi_sudoku", "task.grids=2", "task.givens_in_prompt=true", "sampler.gen_length=32",
                       "sampler.block_length=32", "objective=stabledrl", "trainer.max_steps=2",
                       "diagnostics.samples_every_n_steps=1", "diagnostics.num_samples=8"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 2
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    solutions = {it["puzzle"]: it["solution"] for it in build_task(OmegaConf.to_container(cfg.task, resolve=True)).splits.train}
    assert sum(len(s["completion"]) == 32 for s in samples) >= 2
    for s in samples:
        puzzle, answer = s["prompt"].removesuffix("="), s["completion"]
        assert len(puzzle) == 32
        if len(answer) == 32:  # (a free position that took a special token is not in the text: the cells shift)
            assert all(p == "0" or a == p for p, a in zip(puzzle, answer, strict=True))  # every given stayed pinned
        # the rollout's reward reads the 32 cells of both grids
        assert s["reward"] == pytest.approx(cell_score(parse_answer(answer, 32), puzzle, solutions[puzzle]))
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("ratio/log_max")]
    assert len(rows) == 2 and all(math.isfinite(float(r["ratio/log_max"])) for r in rows)
    after = json.load(open(tmp_path / "run" / "summary.json"))["after"]
    assert 0 <= after["grid_solved_rate"] <= 1 and 0 <= after["grid_valid_rate"] <= 1
