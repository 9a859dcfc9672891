"""Task.splits: train, validation and test items are pairwise disjoint, seeded, and what training uses."""

import pytest

from diffusion_rl.errors import ConfigError
from diffusion_rl.tasks.countdown import CountdownConfig, CountdownTask
from diffusion_rl.tasks.sudoku import SudokuConfig


def key(it):
    return (tuple(it["numbers"]), it["target"])


def test_generic_validation_is_held_out_of_the_training_pool():
    cfg = CountdownConfig(num_train=500, num_test=40, num_val=30, seed=1)
    task = CountdownTask(cfg)
    train, val, test = task.splits
    pool = task.train_items()
    assert len(val) == 30 and len(train) == len(pool) - 30
    assert {key(it) for it in train} | {key(it) for it in val} == {key(it) for it in pool}
    assert not {key(it) for it in train} & {key(it) for it in val}
    assert not {key(it) for it in val} & {key(it) for it in test}
    again = CountdownTask(CountdownConfig(num_train=500, num_test=40, num_val=30, seed=1)).splits
    assert [key(it) for it in again.validation] == [key(it) for it in val]  # seeded
    other = CountdownTask(CountdownConfig(num_train=500, num_test=40, num_val=30, seed=2)).splits
    assert [key(it) for it in other.validation] != [key(it) for it in val]


def test_validation_never_takes_more_than_a_tenth_of_the_pool():
    task = CountdownTask(CountdownConfig(num_train=50, num_test=10, num_val=256))
    assert len(task.splits.validation) == 5 and len(task.splits.train) == 45


def test_warm_start_and_rl_read_the_training_split_only(tmp_path):
    from diffusion_rl.tasks.base import TaskDataModule
    from diffusion_rl.train import build

    from .helpers import compose_cfg

    c = build(compose_cfg(["task.num_val=16"], tmp_path))
    dm = TaskDataModule(c.task)
    dm.setup()
    served = {it["puzzle"] for batch in dm.train_dataloader() for it in batch}
    val = {it["puzzle"] for it in c.task.splits.validation}
    assert served and not served & val and dm.validation_items() == c.task.splits.validation


@pytest.mark.parametrize("kw,key", [({"num_val": -1}, "task.num_val"), ({"loss_mask": "cells"}, "task.loss_mask"),
                                    ({"val_fraction": 0.9}, "task.val_fraction")])
def test_bad_split_options_fail_in_one_line(kw, key):
    with pytest.raises(ConfigError) as err:
        SudokuConfig(**kw).validate()
    assert str(err.value).startswith(key + "=")
