"""Adding an objective is one file and one yaml: the README's example objective, registered and trained."""

import csv
import re
import sys

import torch

from diffusion_rl.app.conf_store import register_configs
from diffusion_rl.app.train import build, train
from diffusion_rl.core.registry import discover
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig
from diffusion_rl.rl.rollout import RolloutEngine
from tests.conftest import ROOT
from tests.helpers.common import compose_cfg


def readme_example() -> tuple[str, str]:
    """The python and yaml blocks of the README's "Adding an objective" section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Adding an objective"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    yaml = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return code, yaml


def register_readme_objective(tmp_path, monkeypatch) -> str:
    """Register the README's objective as a file of ``rl/objectives/`` would be (for this test only) and
    return the Hydra override that finds its yaml."""
    import diffusion_rl.rl.objectives as objectives
    from diffusion_rl.rl.objectives import OBJECTIVES

    code, yaml = readme_example()
    assert len(code.strip().splitlines()) <= 30
    pkg = tmp_path / "plugin"
    pkg.mkdir()
    (pkg / "reinforce.py").write_text(code)
    conf = tmp_path / "conf" / "objective"
    conf.mkdir(parents=True)
    (conf / "reinforce.yaml").write_text(yaml)
    monkeypatch.setattr(objectives, "__path__", [*objectives.__path__, str(pkg)])  # "a file in objectives/"
    monkeypatch.setattr(OBJECTIVES, "_items", dict(OBJECTIVES._items))  # the registration ends with the test
    monkeypatch.delitem(sys.modules, f"{objectives.__name__}.reinforce", raising=False)
    discover(objectives.__name__, objectives.__path__)
    assert "reinforce" in OBJECTIVES
    register_configs()  # the new config dataclass becomes base_reinforce
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def test_readme_objective_registers_from_its_own_file_and_trains(tmp_path, monkeypatch):
    search = register_readme_objective(tmp_path, monkeypatch)
    cfg = compose_cfg(["objective=reinforce", search, "eval.before=false", "eval.after=false"], tmp_path)
    assert cfg.objective.name == "reinforce" and cfg.objective.mu == 1  # the dataclass's defaults
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 4
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert all(float(r["grad/norm"]) >= 0 for r in rows if r.get("grad/norm"))
    assert any(float(r["train/kl"]) > 0 for r in rows if r.get("train/kl"))  # the shared KL anchor acts


def test_readme_objective_scores_as_grpo_does(tmp_path, monkeypatch):
    """On a Sudoku rollout with pinned givens and fresh masks for the new policy
    (``share_masks_with_old=false``), the example's units are GRPO's for every role (each role's masks,
    the scored tokens, the givens shown as context), and no gradient reaches a given's log-probability."""
    search = register_readme_objective(tmp_path, monkeypatch)
    c = build(compose_cfg(["objective=reinforce", search, "task.pin_givens=true",
                           "objective.share_masks_with_old=false"], tmp_path))
    ro = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler)(c.task.splits.train[:2], c.bundle.net, 3)
    assert bool(ro.pinned.any())
    ro.advantages = torch.linspace(-1, 1, ro.completion_ids.shape[0])  # (n,) every row's tokens count
    grpo = GRPO(GRPOConfig(share_masks_with_old=False), c.objective.likelihood)
    policy = logits_fn(c.bundle.net.eval())  # no dropout: each forward is the same function
    ctx = StepContext(ro, inner_iter=1, run_seed=5, policy=policy, old_policy=policy, ref_policy=policy)
    with torch.no_grad():
        for role in ("policy", "old", "ref"):
            ours, theirs = c.objective.logp_units(ctx, policy, role), grpo.logp_units(ctx, policy, role)
            assert torch.equal(ours.logp, theirs.logp), role
            assert torch.equal(ours.mask, theirs.mask) and torch.equal(ours.kl_units()[1], theirs.kl_units()[1]), role
    kept = {}
    logp_units = c.objective.logp_units  # the example's own, before the spy below stands in for it

    def keep_policy_units(ctx, forward, role):
        s = logp_units(ctx, forward, role)
        if role == "policy":
            s.logp.retain_grad()
            kept["logp"] = s.logp
        return s

    monkeypatch.setattr(c.objective, "logp_units", keep_policy_units)
    loss, _ = c.objective.loss(ctx)
    loss.backward()
    grad = kept["logp"].grad  # (n, L) d loss / d log pi of each completion token
    assert bool((grad[~ro.pinned] != 0).any())  # the check can fail: the other tokens carry the gradient
    assert bool((grad[ro.pinned] == 0).all())  # a given is context, not the policy's
