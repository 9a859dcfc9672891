"""RL on a uniform-noise model (DiffusionGemma, ``model=diffusion_gemma_tiny``): the issue's command runs,
every objective that applies takes an update through the rollout engine with its ratio exactly 1 at the
behaviour weights, and every objective or likelihood that reads masked positions refuses at start-up in
one line naming what applies. The full runs of each objective are the slow tier's."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from diffusion_rl.app.evaluate import evaluate_checkpoint
from diffusion_rl.app.train import build, train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives import OBJECTIVES, StepContext
from diffusion_rl.rl.rollout import RolloutEngine
from tests.helpers.common import compose_cfg
from tests.unit.tasks.test_text_tasks import compose_eval

GEMMA = ["model=diffusion_gemma_tiny", "sampler.uniform.steps=4", "task=sudoku", "eval.before=false",
         "eval.after=false"]
# every objective that applies to a uniform-noise model, with what it needs there
APPLY = {
    "tracerl": ["objective=tracerl"],
    "cj_grpo": ["objective=cj_grpo", "objective.mu=2"],
    "egspo": ["objective=egspo"],
    "egspo_sa": ["objective=egspo_sa"],
    "grpo_trajectory": ["objective=grpo", "likelihood=trajectory", "objective.mu=2"],
    "grpo_elbo": ["objective=grpo", "likelihood=uniform_elbo"],
    "stabledrl": ["objective=stabledrl", "likelihood=uniform_elbo"],  # the surrogate follows it: the ELBO
    "espo": ["objective=espo", "likelihood=uniform_elbo", "likelihood.per_token=true"],
    "spg": ["objective=spg", "likelihood=uniform_elbo", "objective.negative=elbo"],
}


def test_the_issue_command_runs_tracerl_on_sudoku(tmp_path):
    """``model=diffusion_gemma_tiny objective=tracerl task=sudoku trainer.max_steps=2`` (warm start included):
    two updates whose rows replay the sampler's own log-probs (mismatch 0 to float precision); src/eval.py
    scores the checkpoint (its frozen routers and vision tower left out of it, rebuilt as trained) as the run
    scored its policy at the end."""
    over = [*GEMMA, "objective=tracerl", "trainer.max_steps=2", "eval.after=true"]
    summary = train(compose_cfg(over, tmp_path), tmp_path / "run")
    assert summary["optimizer_steps"] == 2 and summary["warm_start"]["steps"] == 3
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("train/loss")]
    assert len(rows) == 2 and all(float(r["tracerl/rows"]) > 0 for r in rows)
    assert abs(float(rows[0]["rollout/mismatch_log_ratio"])) < 1e-4 and float(rows[0]["ratio/log_std"]) == 0
    cfg = json.load(open(tmp_path / "run" / "summary.json"))["config"]
    assert cfg["model"]["name"] == "diffusion_gemma_tiny" and cfg["sampler"]["uniform"]["steps"] == 4
    scored = evaluate_checkpoint(compose_eval([f"ckpt_path={tmp_path / 'run'}"], tmp_path), tmp_path / "ev")
    assert scored["cell_accuracy"] == pytest.approx(summary["after"]["cell_accuracy"])


@pytest.mark.parametrize("name", sorted(APPLY))
def test_each_objective_that_applies_takes_an_update_at_ratio_one(tmp_path, name):
    """One rollout through the engine and one loss with the old policy the policy itself: every ratio is 1
    (StableDRL on the masks the old policy shares: its public regime draws fresh ones), the gradient reaches
    the weights."""
    shared = ["objective.share_masks_with_old=true"] if name == "stabledrl" else []
    c = build(compose_cfg([*GEMMA, *APPLY[name], *shared], tmp_path))
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.run.rollout, 0)
    ro = engine(c.task.splits.train[:2], c.bundle.net, 0)
    f = logits_fn(c.bundle.net)
    loss, metrics = c.objective.loss(StepContext(ro, 0, 0, f, f, f))
    loss.backward()
    assert torch.isfinite(loss)
    assert max(abs(float(metrics[k])) for k in ("ratio/log_min", "ratio/log_max") if k in metrics) < 1e-3
    grads = [p.grad for p in c.bundle.net.parameters() if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(APPLY))
def test_each_objective_that_applies_runs(tmp_path, name):
    summary = train(compose_cfg([*GEMMA, *APPLY[name], "trainer.max_steps=2"], tmp_path), tmp_path / "run")
    assert summary["optimizer_steps"] == 2


REFUSED = sorted(set(OBJECTIVES.names()) - {a[0].split("=")[1] for a in APPLY.values()})


@pytest.mark.parametrize("name", REFUSED)
def test_an_objective_that_reads_masked_positions_refuses_in_one_line(tmp_path, name):
    with pytest.raises(ConfigError) as err:
        build(compose_cfg([*GEMMA, f"objective={name}"], tmp_path), meta=True)
    msg = str(err.value)
    assert "\n" not in msg and f"objective.name='{name}'" in msg and "no mask token" in msg and "tracerl" in msg


@pytest.mark.parametrize("overrides, key, hint", [
    (["objective=grpo"], "likelihood.name='one_step'", "likelihood=trajectory or uniform_elbo"),
    (["objective=stabledrl"], "likelihood.name='spg_blocks'", "likelihood=uniform_elbo"),
    (["objective=stabledrl", "likelihood=uniform_elbo", "objective.surrogate=spg_mix"], "objective.surrogate='spg_mix'",
     "objective.surrogate=elbo"),
    (["objective=spg", "likelihood=uniform_elbo"], "objective.negative='mix'", "objective.negative=elbo"),
    (["objective=espo", "likelihood=uniform_elbo"], "likelihood.name='uniform_elbo'", "likelihood.per_token=true"),
    (["objective=tracerl", "objective.shrink=8"], "objective.shrink=8", "must be 1"),
    (["objective=grpo", "likelihood=trajectory", "model.block_size=12"], "sampler.gen_length=16", "canvas_length=12"),
    (["objective=grpo", "likelihood=uniform_elbo", "rollout.tree.branches=[2,2]"], "rollout.tree.branches",
     "masked-diffusion sampler"),
    (["objective=tracerl", "sampler.kv_cache=prefix"], "sampler.kv_cache='prefix'", "sampler.uniform"),
])
def test_a_setting_that_needs_a_mask_token_refuses_in_one_line(tmp_path, overrides, key, hint):
    with pytest.raises(ConfigError) as err:
        build(compose_cfg([*GEMMA, *overrides], tmp_path), meta=True)
    assert "\n" not in str(err.value) and key in str(err.value) and hint in str(err.value)


def test_the_uniform_elbo_refuses_a_masked_model(tmp_path):
    with pytest.raises(ConfigError) as err:
        build(compose_cfg(["objective=stabledrl", "likelihood=uniform_elbo", "objective.surrogate=elbo"], tmp_path),
              meta=True)
    assert "uniform-noise model" in str(err.value) and "likelihood=elbo" not in str(err.value).split(":")[0]
