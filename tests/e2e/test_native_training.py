"""RL through the native models, as a user runs it: ``model=<preset> model.path=<folder>`` on tiny
checkpoints in the released layouts, two optimizer steps with every objective, LoRA on and off.

The presets' bf16 weights are set to fp32 (bf16 matmuls are slow on CPU); everything else is the
preset's (activation checkpointing, LoRA targets, attention). SDAR, TraDo and LLaDA2, block models, score
sequences with the staircase estimator where the objective uses a sequence-level one. A random model scores 0
on Sudoku cells, so every advantage would be 0 and nothing would move: the reward here is a
deterministic function of the completion's characters instead, which varies within a group.
"""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path

import pytest
import torch

from diffusion_rl.app.train import train
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.registry import discover
from diffusion_rl.rl.objectives import OBJECTIVES
from diffusion_rl.tasks.sudoku import SudokuTask
from tests.helpers.common import STEP_OBJECTIVES, capture_module, compose_cfg
from tests.helpers.released_layouts import write_checkpoint

PRESETS = {"llada": "llada_8b_instruct", "dream": "dream_7b_instruct", "sdar": "sdar_8b_chat",
           "diffucoder": "diffucoder_7b_instruct", "trado": "trado_8b_instruct", "llada2": "llada2_mini"}
BLOCK = {"sdar", "trado", "llada2"}  # block models: a sequence-level objective scores with the staircase
# objectives that refuse block models (MDPO: its one-step prediction lies outside the block the sampler computes)
MASKED_ONLY = {"mdpo"}
# LLaDA2's preset runs blocks of 32: one block of completion
GEN = {"llada2": ["sampler.gen_length=32", "sampler.block_length=32"]}
SMALL = [  # two prompts x 4 samples, 8 tokens, no warm start or evaluation: only the RL steps
    "task.num_train=64", "task.num_test=8", "task.prompts_per_batch=2", "task.group_size=4",
    "warmstart.enabled=false", "eval.before=false", "eval.after=false", "sampler.gen_length=8",
    "sampler.block_length=8", "sampler.steps=4", "trainer.enable_progress_bar=false",
    "trainer.checkpoint_every_n_steps=0", "diagnostics.samples_every_n_steps=0", "trainer.max_steps=2",
    "model.dtype=float32",
]


def char_reward(prompts, completions, **_) -> list[float]:
    return [float(sum(map(ord, c)) % 5) for c in completions]


def objectives() -> list[str]:
    import diffusion_rl.rl.objectives as pkg

    discover(pkg.__name__, pkg.__path__)
    return OBJECTIVES.names()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("released")
    return {a: write_checkpoint(a, root / a, real_ids=False) for a in PRESETS}


def run(folder: Path, arch: str, objective: str, lora: int, tmp_path: Path, monkeypatch) -> tuple[dict, dict, dict]:
    # the staircase ELBO scores block models; SPG's bound (StableDRL's public surrogate) needs its own masks
    extra = ["likelihood=staircase"] if arch in BLOCK and objective == "stabledrl" else []
    # two optimizer steps whatever the objective's inner updates per rollout (ESPO's default is 8)
    extra.append(f"objective.mu={min(OBJECTIVES.get(objective).config_class().mu, 2)}")
    if objective in STEP_OBJECTIVES:
        extra.append("objective.K=2")  # the public K = 8 exceeds the small sampler's steps
    if objective == "bgpo":
        extra.append("likelihood.num_samples=4")  # 16 copies are 16 forwards and backwards per update; 4 run the same code
    cfg = compose_cfg([f"model={PRESETS[arch]}", f"model.path={folder}", f"model.lora_r={lora}",
                       f"objective={objective}", *extra, *SMALL, *GEN.get(arch, [])], tmp_path, tiny=False)
    captured = capture_module(monkeypatch)
    monkeypatch.setattr(SudokuTask, "reward_functions", lambda self: [("chars", char_reward, 1.0)])
    summary = train(cfg, tmp_path / "run")
    return summary, captured["start"], captured["module"].policy.state_dict()


@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("objective", objectives())
@pytest.mark.parametrize("arch", sorted(PRESETS))
def test_two_rl_steps(folders, arch, objective, lora, tmp_path, monkeypatch):
    if lora:
        pytest.importorskip("peft")
    # refused at start-up in one line on a block model: trees branch the masked-diffusion sampler; JustGRPO
    # decodes left to right, which a block model's sampler does not; MDPO (MASKED_ONLY) values the
    # masked-diffusion sampler's predictions
    refused = {"justgrpo": r"^model\.block_size=\d+ is invalid: objective=justgrpo"}
    refused.update(dict.fromkeys(MASKED_ONLY, "model.block_size"))
    if arch in BLOCK and (OBJECTIVES.get(objective).needs_tree or objective in refused):
        with pytest.raises(ConfigError, match=refused.get(objective, r"rollout\.tree\.branches.*block model")):
            run(folders[arch], arch, objective, lora, tmp_path, monkeypatch)
        return
    summary, start, end = run(folders[arch], arch, objective, lora, tmp_path, monkeypatch)
    assert summary["optimizer_steps"] == 2
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    changed = {k for k in end if not torch.equal(start[k], end[k])}
    assert changed, "no parameter changed"
    assert ("moe/idle_expert_frac" in rows[-1]) == (arch == "llada2")  # the routers' load, logged per update
    assert not any(k.endswith(("mlp.gate.weight", "expert_bias")) for k in changed)  # routers stay as released
    assert all("lora_" in k for k in changed) == bool(lora)  # with LoRA only the adapters train


@pytest.mark.parametrize("old_policy", ["copy", "precomputed"])
def test_lora_dropout_leaves_the_ratio_exactly_one_at_theta_old(folders, old_policy, tmp_path, monkeypatch):
    """Old and new log-probs are taken in one mode (dropout off in both), so with one update per
    rollout the ratio is exactly 1 at every step, LoRA dropout or not; with dropout left on in the
    update it is not once the B matrices have left zero (the control: the test can fail). The old
    policy's forward is forced (at the first update after a rollout it is skipped otherwise, its
    values being the policy's own), so the two forwards' modes are what is compared."""
    pytest.importorskip("peft")
    import diffusion_rl.training.module as module_mod
    from diffusion_rl.rl.objectives.base import Objective

    monkeypatch.setattr(Objective, "old_logp_like_policy", lambda self: False)

    def ratio_spread(run_dir: Path) -> list[float]:
        rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
        return [max(abs(float(r["ratio/log_max"])), abs(float(r["ratio/log_min"]))) for r in rows if r.get("ratio/log_max")]

    args = ["model=llada_8b_instruct", f"model.path={folders['llada']}", "model.lora_r=8", "model.lora_dropout=0.5",
            "objective=grpo", "objective.mu=1", "optim.lr=3e-4", f"old_policy={old_policy}", *SMALL, "trainer.max_steps=3"]
    monkeypatch.setattr(SudokuTask, "reward_functions", lambda self: [("chars", char_reward, 1.0)])
    train(compose_cfg(args, tmp_path, tiny=False), tmp_path / "one_mode")
    assert ratio_spread(tmp_path / "one_mode") == [0.0, 0.0, 0.0]
    monkeypatch.setattr(module_mod, "dropout_disabled", lambda net: contextlib.nullcontext())
    train(compose_cfg(args, tmp_path, tiny=False), tmp_path / "dropout_on")
    assert ratio_spread(tmp_path / "dropout_on")[-1] > 1e-6  # dropout noise in the ratio


@pytest.mark.parametrize("arch", sorted(PRESETS))
def test_checkpoint_round_trip_resumes_where_the_run_left_off(folders, arch, tmp_path, monkeypatch):
    """Every preset: two steps with a checkpoint after each, resumed from ``last`` for a third, equal
    the three-step run (metrics and weights); the checkpoint holds what trains plus the buffers
    (LLaDA2's expert biases) and not the frozen routers."""
    args = [f"model={PRESETS[arch]}", f"model.path={folders[arch]}", "model.lora_r=0", "objective=grpo",
            "objective.mu=1", *SMALL, *GEN.get(arch, []), "trainer.checkpoint_every_n_steps=1"]
    monkeypatch.setattr(SudokuTask, "reward_functions", lambda self: [("chars", char_reward, 1.0)])
    train(compose_cfg([*args, "trainer.max_steps=3"], tmp_path, tiny=False), tmp_path / "whole")
    train(compose_cfg(args, tmp_path, tiny=False), tmp_path / "cut")  # SMALL's max_steps=2
    train(compose_cfg([*args, "trainer.max_steps=3", f"ckpt_path={tmp_path / 'cut' / 'checkpoints' / 'last.ckpt'}"],
                      tmp_path, tiny=False), tmp_path / "cut")
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 3 and set(a["state_dict"]) == set(b["state_dict"])
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), k
    steps = [r["step"] for r in csv.DictReader(open(tmp_path / "cut" / "metrics.csv")) if r.get("train/loss")]
    assert steps == ["1", "2", "3"]  # the resumed run took one step, from the checkpoint's
    if arch == "llada2":
        assert any(k.endswith("expert_bias") for k in a["state_dict"])
        assert not any(k.endswith("mlp.gate.weight") for k in a["state_dict"])
