"""Where each value of a config comes from (diffusion_rl/app/sources.py): the replay of Hydra's merge ends
at Hydra's own composition, for every objective, task and experiment, and it names the right files."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from diffusion_rl.app.sources import COMMAND_LINE, DATACLASS, _leaves, config_sources, explain
from tests.conftest import CONF

COMMANDS = ([[f"objective={p.stem}"] for p in sorted((CONF / "objective").glob("*.yaml"))]
            + [[f"task={p.stem}"] for p in sorted((CONF / "task").glob("*.yaml"))]
            + [[f"experiment={p.stem}"] for p in sorted((CONF / "experiment").glob("*.yaml"))]
            + [["model=tiny_block", "objective=stabledrl", "likelihood=staircase", "+ablation=clip_only", "~testbed",
                "optim.betas=[0.9,0.95]", "+model.extra={attn_implementation: sdpa}"]])


@pytest.mark.parametrize("overrides", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_the_replay_ends_at_hydras_composition(overrides):
    src = config_sources(CONF, overrides)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    composed = dict(_leaves(cfg))
    assert {k: s[-1][1] for k, s in src.values.items()} == composed  # every key, its last setting the value
    assert src.choices and all(by == COMMAND_LINE or by.startswith("conf/") for _, _, by in src.choices)


def test_the_default_job_names_each_file_that_set_its_values():
    src = config_sources(CONF, ["objective=grpo", "task=sudoku"])
    assert src.values["optim.lr"] == [(DATACLASS, 3e-4), ("conf/optim/d1.yaml", 3e-6), ("conf/testbed/tiny_grpo.yaml", 3e-4)]
    assert src.values["objective.mu"] == [(DATACLASS, 12), ("conf/recipe/grpo_sudoku.yaml", 8),
                                          ("conf/testbed/tiny_grpo.yaml", 1)]
    assert src.values["advantage.credit"][-1] == ("conf/testbed/tiny_grpo_sudoku.yaml", "token")
    assert ("optim", "d1", "conf/objective/grpo.yaml") in src.choices
    assert ("advantage", "group", "conf/objective/grpo.yaml") in src.choices
    assert ("objective", "grpo", COMMAND_LINE) in src.choices
    assert ("testbed", "tiny_grpo_sudoku", "conf/testbed/tiny_grpo.yaml") in src.choices
    assert "objective.eps" not in src.set_over_defaults()  # the dataclass's 0.5, d1's: no file sets it
    # the variant: what the testbed sets beyond d1's regime (group choices on the command line are no values)
    assert src.variant() == {"conf/testbed/tiny_grpo.yaml": {"optim.lr": 3e-4, "objective.mu": 1},
                             "conf/testbed/tiny_grpo_sudoku.yaml": {"advantage.credit": "token", "objective.beta": 0.002}}


def test_the_command_line_and_an_experiment_are_named_over_the_files():
    src = config_sources(CONF, ["experiment=stabledrl_eps", "objective.eps=100", "~testbed"])
    assert src.values["objective.eps"][-1] == (COMMAND_LINE, 100)
    assert src.values["objective.beta"] == [(DATACLASS, 0.0), ("conf/experiment/stabledrl_eps.yaml", 0.0)]
    assert ("objective", "stabledrl", "conf/experiment/stabledrl_eps.yaml") in src.choices
    assert not any(g == "testbed" for g, _, _ in src.choices)
    variant = src.variant()
    assert variant[COMMAND_LINE] == {"objective.eps": 100}
    assert variant["conf/experiment/stabledrl_eps.yaml"]["trainer.max_steps"] == 200


def test_a_deleted_key_leaves_the_sources_with_everything_below_it():
    src = config_sources(CONF, ["~trainer.strategy_kwargs", "~testbed"])
    assert not any(k == "trainer.strategy_kwargs" or k.startswith("trainer.strategy_kwargs.") for k in src.values)
    src = config_sources(CONF, ["~optim", "~testbed"])
    assert not any(k.startswith("optim.") for k in src.values)


def test_explain_shows_each_value_over_its_earlier_settings():
    text = explain(CONF, ["objective=grpo", "task=sudoku", "optim.lr=1e-3"])
    assert "optim.lr = 0.001" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("optim.lr ="))
    assert line.split()[3:] == ["command", "line", "(over", "conf/optim/d1.yaml:", "3e-06;",
                                "conf/testbed/tiny_grpo.yaml:", "0.0003)"]
    assert "task=sudoku" in text and "Every other value is its dataclass default" in text
    assert OmegaConf.create({"a": 1})  # the text is plain, no config object leaks into it
