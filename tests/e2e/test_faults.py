"""Each injected fault (conf/fault/) over a whole tiny run: the run finishes, counts what happened, and its
weights are sane.

A spy wraps the module's ``inner_update`` to record, per update, whether it was skipped and whether
the weights and Adam's step counts moved. The ``raise`` and ``kill`` faults are covered by
tests/e2e/test_resume.py (the run stops, then resumes exactly); the faults' pieces and refusals by
tests/unit/training/test_faults.py.
"""

import csv
import logging

import pytest
import torch

from diffusion_rl.app.train import train
from diffusion_rl.core.errors import ConfigError
from tests.helpers.common import compose_cfg


def snapshot(net) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def spy(monkeypatch):
    """Records every inner update and rollout of the module that ``train`` builds."""
    import diffusion_rl.app.train as train_mod

    real = train_mod.DiffusionRLModule
    rec: dict = {"updates": [], "rewards": []}

    def make(*args, **kwargs):
        m = real(*args, **kwargs)
        rec["module"], rec["start"] = m, snapshot(m.policy)
        inner_update, rollout = m.inner_update, m.rollout

        def adam_steps():
            return sum(float(s["step"]) for s in m.optimizers().optimizer.state.values())

        def recorded_update(ctx, inner_iter):
            before, skips, steps = snapshot(m.policy), m.skipped_updates, adam_steps()
            inner_update(ctx, inner_iter)
            rec["updates"].append({"skipped": m.skipped_updates > skips, "weights_same": same(before, snapshot(m.policy)),
                                   "adam_same": adam_steps() == steps})

        def recorded_rollout(items):
            ro = rollout(items)
            rec["rewards"].append(ro.rewards.clone())
            return ro

        m.inner_update, m.rollout = recorded_update, recorded_rollout
        return m

    monkeypatch.setattr(train_mod, "DiffusionRLModule", make)
    return rec


def assert_trained(rec, summary, max_steps: int) -> None:
    end = rec["module"].policy.state_dict()
    assert summary["optimizer_steps"] == max_steps
    assert all(torch.isfinite(v).all() for v in end.values())
    assert not same(rec["start"], snapshot(rec["module"].policy)), "no parameter changed"


@pytest.mark.parametrize("objective", ["grpo", "stabledrl", "egspo", "egspo_sa"])
@pytest.mark.parametrize("kind", ["nan_loss", "nan_grad"])
def test_nonfinite_update_is_skipped_and_counted(tmp_path, spy, objective, kind):
    # mu=2: the second update of rollout 1 and the first of rollout 2 are poisoned
    cfg = compose_cfg([f"objective={objective}", "objective.mu=2", f"fault={kind}", "fault.at_step=1",
                       "fault.times=2", "trainer.max_steps=4", "eval.before=false", "eval.after=false"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    ups = spy["updates"]
    assert [u["skipped"] for u in ups] == [False, True, True, False, False, False]
    for u in ups:  # a skipped update leaves weights and optimizer untouched; the others step Adam
        assert (u["weights_same"] and u["adam_same"]) if u["skipped"] else not u["adam_same"]
    assert summary["skipped_updates"] == 2 and summary["rollouts"] == 3
    assert_trained(spy, summary, 4)
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert float(rows[-1]["train/skipped_updates"]) == 2


def test_reward_raising_on_some_completions_costs_only_those(tmp_path, spy, caplog):
    cfg = compose_cfg(["fault=reward_raises", "fault.every=2", "task.failure_reward=-1.0",
                       "objective.mu=1", "trainer.max_steps=3"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.tasks.base"):
        summary = train(cfg, tmp_path / "run")
    assert len(spy["rewards"]) == 3
    for r in spy["rewards"]:  # 2 prompts x 4 samples: completions 0, 2, 4, 6 raised
        assert r.tolist()[0::2] == [-1.0] * 4
        assert all(0.0 <= v <= 1.0 for v in r.tolist()[1::2])
    assert summary["reward_failures"] == 12
    warnings = [rec for rec in caplog.records if "raised" in rec.getMessage()]
    assert len(warnings) == 1 and "logged once" in warnings[0].getMessage()
    assert "before" in summary and "after" in summary  # evaluation is not touched by the fault
    assert_trained(spy, summary, 3)


@pytest.mark.parametrize("target,refused,named", [("last", "last", "step000004.ckpt"),
                                                  ("step", "step000004.ckpt", "step000002.ckpt")])
def test_truncated_checkpoint_is_refused_naming_the_newest_good_one(tmp_path, spy, target, refused, named):
    cfg = compose_cfg(["fault=truncate_ckpt", "fault.at_step=4", f"fault.target={target}", "objective.mu=2",
                       "eval.before=false", "eval.after=false"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert_trained(spy, summary, 4)
    ckpts = tmp_path / "run" / "checkpoints"
    bad = ckpts / ("last.ckpt" if target == "last" else refused)
    good = torch.load(ckpts / ("step000004.ckpt" if target == "last" else "last.ckpt"), weights_only=True)
    final = spy["module"].policy.state_dict()
    assert all(torch.equal(good["state_dict"][f"policy.{k}"], v) for k, v in final.items())
    arg = "last" if refused == "last" else str(bad)
    with pytest.raises(ConfigError) as err:
        train(compose_cfg([f"ckpt_path={arg}"], tmp_path), tmp_path / "run")
    msg = str(err.value)
    assert "\n" not in msg and f"refused {bad}" in msg and f"newest readable checkpoint there: {ckpts / named}" in msg
