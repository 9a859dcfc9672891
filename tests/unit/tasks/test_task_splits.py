"""Task.splits: train, validation and test items are pairwise disjoint, seeded, and what training uses."""

import json
from dataclasses import replace

import pytest

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.countdown import CountdownConfig, CountdownTask, generate_instances
from diffusion_rl.tasks.sudoku import SudokuConfig, SudokuTask


def key(it):
    return (tuple(it["numbers"]), it["target"])


def _train_file(tmp_path, n):
    """A Countdown training file (``task.train_data_path``): no natural validation split."""
    rows = generate_instances(n, "file", 1, 30, 1, 100)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"nums": it["numbers"], "target": it["target"]}) + "\n" for it in rows))
    return str(path)


def test_generic_validation_is_held_out_of_the_training_pool(tmp_path):
    cfg = CountdownConfig(num_train=500, num_test=40, num_val=30, seed=1, train_data_path=_train_file(tmp_path, 600))
    task = CountdownTask(cfg)
    train, val, test = task.splits
    pool = task.train_items()
    assert len(pool) == 500 and len(val) == 30 and len(train) == len(pool) - 30
    assert {key(it) for it in train} | {key(it) for it in val} == {key(it) for it in pool}
    assert not {key(it) for it in train} & {key(it) for it in val}
    assert not {key(it) for it in val} & {key(it) for it in test}
    again = CountdownTask(replace(cfg)).splits
    assert [key(it) for it in again.validation] == [key(it) for it in val]  # seeded
    other = CountdownTask(replace(cfg, seed=2)).splits
    assert [key(it) for it in other.validation] != [key(it) for it in val]


def test_validation_never_takes_more_than_a_tenth_of_the_pool(tmp_path):
    task = CountdownTask(CountdownConfig(num_train=50, num_test=10, num_val=256, train_data_path=_train_file(tmp_path, 50)))
    assert len(task.splits.validation) == 5 and len(task.splits.train) == 45


@pytest.mark.parametrize("name", ["sudoku", "countdown"])
def test_generated_tasks_draw_fresh_validation_items_and_keep_their_training_pool(name):
    """Sudoku and generated Countdown: validation items are new draws (Sudoku: puzzles of the training
    grids), in no other split, seeded, and the training split is the whole pool whatever num_val is,
    so that adding the split changed no training run."""
    if name == "sudoku":
        make = lambda **kw: SudokuTask(SudokuConfig(num_train=400, num_test=40, **kw))  # noqa: E731
        ident = lambda it: it["puzzle"]  # noqa: E731
    else:
        make = lambda **kw: CountdownTask(CountdownConfig(num_train=400, num_test=40, **kw))  # noqa: E731
        ident = key
    task = make(num_val=64)
    train, val, test = task.splits
    assert len(val) == 64 and len({ident(it) for it in val}) == 64
    assert [ident(it) for it in train] == [ident(it) for it in make(num_val=0).splits.train]  # the pool, unchanged
    assert [ident(it) for it in train] == [ident(it) for it in task.train_items()]
    assert not {ident(it) for it in val} & ({ident(it) for it in train} | {ident(it) for it in test})
    assert [ident(it) for it in make(num_val=64).splits.validation] == [ident(it) for it in val]  # seeded
    assert [ident(it) for it in make(num_val=64, seed=1).splits.validation] != [ident(it) for it in val]
    if name == "sudoku":
        assert {it["solution"] for it in val} <= set(task.train_grids())  # never a test grid
        assert not {it["solution"] for it in val} & {it["solution"] for it in test}


def test_warm_start_and_rl_read_the_training_split_only(tmp_path):
    from diffusion_rl.app.train import build
    from diffusion_rl.tasks.base import TaskDataModule
    from tests.helpers.common import compose_cfg

    c = build(compose_cfg(["task.num_val=16"], tmp_path))
    dm = TaskDataModule(c.task)
    dm.setup()
    served = {it["puzzle"] for batch in dm.train_dataloader() for it in batch}
    val = {it["puzzle"] for it in c.task.splits.validation}
    assert served and not served & val and dm.validation_items() == c.task.splits.validation


@pytest.mark.parametrize("kw,key", [({"num_val": -1}, "task.num_val"), ({"loss_mask": "cells"}, "task.loss_mask")])
def test_bad_split_options_fail_in_one_line(kw, key):
    with pytest.raises(ConfigError) as err:
        SudokuConfig(**kw).validate()
    assert str(err.value).startswith(key + "=")
