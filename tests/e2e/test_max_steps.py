"""trainer.max_steps counts optimizer steps, whatever the inner updates per rollout."""

import json

import pytest

from diffusion_rl.app.train import train
from tests.helpers.common import compose_cfg

RUN = ["eval.before=false", "eval.after=false", "eval.every_n_steps=0", "trainer.checkpoint_every_n_steps=0",
       "diagnostics.samples_every_n_steps=0"]


@pytest.mark.parametrize("mu,max_steps,rollouts", [(4, 3, 1), (2, 5, 3), (1, 2, 2)])
def test_max_steps_stops_inside_a_rollouts_updates(tmp_path, mu, max_steps, rollouts):
    args = ["objective=grpo", f"objective.mu={mu}", f"trainer.max_steps={max_steps}", *RUN]
    summary = train(compose_cfg(args, tmp_path), tmp_path / "run")
    assert (summary["optimizer_steps"], summary["rollouts"]) == (max_steps, rollouts)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["optimizer_steps"] == max_steps
