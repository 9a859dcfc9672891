"""One tiny end-to-end RL run per objective: parameters change, metrics are written, old policy synced."""

import csv
import json

import pytest
import torch

from diffusion_rl.app.train import build, train
from diffusion_rl.rl.objectives import OBJECTIVES
from tests.helpers.common import capture_module, compose_cfg


@pytest.mark.parametrize("objective", OBJECTIVES.names())
def test_tiny_run_end_to_end(tmp_path, objective, monkeypatch):
    cfg = compose_cfg([f"objective={objective}", "objective.mu=2"], tmp_path)
    captured = capture_module(monkeypatch)
    summary = train(cfg, tmp_path / "run")
    m = captured["module"]
    end = m.policy.state_dict()
    assert any(not torch.equal(captured["start"][k], end[k]) for k in end), "no parameter changed"
    for k, v in m.old_policy.state_dict().items():  # synced after the last inner update
        assert torch.equal(v, end[k])
    assert summary["optimizer_steps"] == 4
    assert summary["rollouts"] == 2  # mu=2 updates per rollout
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    steps = [r for r in rows if r.get("grad/norm")]
    assert len(steps) == 4
    for key in ("train/loss", "train/reward", "grad/norm", "grad/norm_ema", "ratio/log_std", "train/lr"):
        assert key in rows[0], key
    norms = [float(r["grad/norm"]) for r in steps]
    assert all(n >= 0 for n in norms) and any(n > 0 for n in norms)  # a zero-std group gives 0
    s = json.load(open(tmp_path / "run" / "summary.json"))
    assert set(s["before"]) >= {"cell_accuracy", "solved_rate", "valid_rate"}
    assert s["environment"]["packages"]["torch"] == torch.__version__
    assert s["environment"]["torch_threads"] == torch.get_num_threads()
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
    assert (tmp_path / "run" / "eval_generations.jsonl").exists()


def test_nonfinite_loss_skips_update_and_keeps_weights(tmp_path):
    cfg = compose_cfg(["trainer.max_steps=2"], tmp_path)
    c = build(cfg)
    from diffusion_rl.tasks import TaskDataModule
    from diffusion_rl.training.module import DiffusionRLModule

    module = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0)

    class NaNObjective(type(c.objective)):
        def loss(self, ctx):
            logp = ctx.policy(ctx.rollout.prompt_ids, ctx.rollout.prompt_mask).sum()
            return logp * float("nan"), {}

    module.objective = NaNObjective(c.objective.cfg, c.objective.likelihood)
    import lightning as L

    trainer = L.Trainer(max_steps=2, max_epochs=1, limit_train_batches=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    dm = TaskDataModule(c.task)
    trainer.fit(module, datamodule=dm)
    after = module.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in after)
    assert module.skipped_updates == 3 * c.objective.cfg.mu
    assert trainer.global_step == 0


@pytest.mark.parametrize("objective,options", [
    ("grpo", ["sampler=sudoku_threshold", "sampler.threshold=0.5", "objective.behaviour_correction=tis"]),
    ("stabledrl", ["sampler.decode=factor", "sampler.remasking=low_confidence", "sampler.kv_cache=prefix",
                   "objective.behaviour_correction=tis"]),
    ("egspo", ["sampler=sudoku_threshold", "sampler.stop_after_eos=true"]),
    ("egspo_sa", ["sampler.kv_cache=dual", "sampler.stop_after_eos=true", "objective.behaviour_correction=tis"]),
], ids=["grpo-threshold-dual-tis", "stabledrl-factor-prefix-tis", "egspo-threshold-dual-stop", "egspo_sa-dual-stop-tis"])
def test_tiny_run_with_fast_rollouts(tmp_path, objective, options):
    """One RL run per sampler option: it trains, logs the sampler's cost and the mismatch every step,
    and evaluates with the exact sampler (eval.fast_sampler=false)."""
    two_blocks = ["sampler.gen_length=16", "sampler.block_length=8", "sampler.steps=4", "objective.K=2"]
    cfg = compose_cfg([f"objective={objective}", *two_blocks[: 4 if objective.startswith("egspo") else 3], *options],
                      tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 4 and summary["fit_s"] > 0
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("grad/norm")]
    assert len(rows) == 4
    for r in rows:  # the rollout's cost rides with its first update; the mismatch is every update's
        if float(r["train/inner_iter"]) == 0:
            assert float(r["rollout/forwards_per_sample"]) > 0 and float(r["rollout/tokens_per_forward"]) > 0
            assert 0 < float(r["rollout/steps_per_sample"]) <= 16  # at most one step per token
            assert float(r["time/rollout_s"]) > 0
        assert float(r["time/update_s"]) > 0 and r["rollout/mismatch_log_ratio"] not in ("", None)
        if "objective.behaviour_correction=tis" in options:
            assert 0 < float(r["tis/weight_mean"]) <= 2.0
    assert (tmp_path / "run" / "eval_generations.jsonl").exists()
