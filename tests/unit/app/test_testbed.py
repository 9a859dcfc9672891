"""A testbed's group choices by task (diffusion_rl/app/testbed.py), on the real conf tree and on a small one."""

from __future__ import annotations

import pytest

from diffusion_rl.app.testbed import groups_chosen, task_choices
from diffusion_rl.core.config import override_key
from diffusion_rl.core.errors import ConfigError
from tests.helpers.common import CONF, compose_cfg


def _credit(tmp_path, *overrides):
    c = compose_cfg(list(overrides), tmp_path, tiny=False)
    return c.advantage.name, c.warmstart.steps, c.trainer.max_steps


def test_the_default_grpo_job_runs_the_testbeds_sudoku_settings(tmp_path):
    assert _credit(tmp_path) == ("per_token", 200, 500)
    assert _credit(tmp_path, "objective=grpo", "task=sudoku") == ("per_token", 200, 500)
    assert _credit(tmp_path, "~testbed") == ("group", 140, 200)  # d1's regime: r - mean, the dataclass defaults


@pytest.mark.parametrize("overrides, expected", [
    (["advantage=group_std"], ("group_std", 200, 500)),  # the command line's group wins
    (["trainer.max_steps=7", "warmstart.steps=9"], ("per_token", 9, 7)),  # and its values, as over any testbed value
    (["task=countdown"], ("group", 200, 500)),  # only Sudoku scores each cell: the choice is Sudoku's
    (["objective=stabledrl"], ("group", 140, 200)),  # another objective's testbed has no such choice
    (["likelihood=elbo"], ("group", 200, 500)),  # refused beside a sequence likelihood: left out
    (["experiment=objectives_sudoku"], ("group", 140, 100)),  # an experiment that turns the choices off
    (["experiment=sudoku_credit", "advantage=group_std"], ("group_std", 140, 200)),
    (["experiment=sudoku_target"], ("per_token", 200, 500)),
])
def test_the_command_line_and_the_experiment_choose_over_the_testbed(tmp_path, overrides, expected):
    assert _credit(tmp_path, *overrides) == expected


def test_a_group_an_experiment_or_the_configs_it_selects_override_is_theirs(tmp_path):
    conf = tmp_path / "conf"
    for group in ("advantage", "experiment", "ablation", "task"):
        (conf / group).mkdir(parents=True)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /ablation: arm\n  - override /task: sudoku\n\ntrainer:\n  threads: 1\n")
    (conf / "ablation" / "arm.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /advantage@_global_.advantage: loo\n")
    chosen = groups_chosen(["seed=3", "objective.eps=5"], {"experiment": "mine", "ablation": "arm"}, conf)
    assert chosen == {"seed", "ablation", "advantage", "task"}  # seed: a root key, never a group
    assert groups_chosen(["+ablation=arm"], {"experiment": None, "ablation": "arm"}, conf) == {"ablation", "advantage"}
    (conf / "task" / "sudoku.yaml").write_text("defaults:\n  - override /advantage@_global_.advantage: loo\n")
    # the configs the testbed is chosen by make the choices it refines
    assert groups_chosen(["task=sudoku"], {"experiment": None, "task": "sudoku"}, conf) == {"task"}
    assert groups_chosen([], {"experiment": None}, conf) == set()
    assert override_key("override /advantage@_global_.advantage") == "advantage"
    assert override_key("~testbed") == "testbed" and override_key("++optim.lr=1") == "optim.lr"


def test_a_testbed_choice_that_is_no_group_choice_fails_in_one_line(tmp_path):
    cfg = compose_cfg([], tmp_path, tiny=False)
    cfg.testbed_choices = {"sudoku": ["advantage.eps=0.1"]}
    with pytest.raises(ConfigError, match=r"testbed_choices.sudoku='advantage.eps=0.1' is invalid: .*group=option for a config group"):
        task_choices(cfg, "sudoku", set(), CONF)
    cfg.testbed_choices = {"sudoku": ["advantage=per_cell"]}
    with pytest.raises(ConfigError, match=r"unknown advantage; allowed: .*per_token"):
        task_choices(cfg, "sudoku", set(), CONF)
    cfg.testbed_choices = {"sudoku": ["advantage=loo", "likelihood=elbo"]}
    assert task_choices(cfg, "sudoku", {"likelihood"}, CONF) == ["advantage=loo"]
    assert task_choices(cfg, "countdown", set(), CONF) == []


def test_a_choice_the_run_refuses_is_left_out_and_the_log_says_why(tmp_path, caplog):
    with caplog.at_level("INFO", logger="diffusion_rl.app.testbed"):
        assert _credit(tmp_path, "likelihood=elbo") == ("group", 200, 500)
    assert "testbed on sudoku: advantage=per_token (conf/testbed/tiny_grpo.yaml) left out: " \
           "advantage.name='per_token' is invalid: needs a per-token likelihood" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="diffusion_rl.app.testbed"):  # wrong without the choice too: its own error
        cfg = compose_cfg(["sampler.steps=0"], tmp_path, tiny=False)
    assert cfg.advantage.name == "per_token" and "left out" not in caplog.text
