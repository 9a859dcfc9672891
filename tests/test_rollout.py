"""The rollout engine: one scoring pass, the reward's loss mask, and dynamic sampling (DAPO)."""

import pytest
import torch

from diffusion_rl.advantages import ADVANTAGES
from diffusion_rl.errors import ConfigError
from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.objectives.base import StepContext
from diffusion_rl.rollout import RolloutEngine
from diffusion_rl.sampling import SamplerConfig, generate
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.train import build

from .helpers import compose_cfg


def engine_of(c, oversample=1, advantage=None):
    adv = c.advantage
    if advantage is not None:
        cls = ADVANTAGES.get(advantage)
        adv = cls(cls.config_class())
    return RolloutEngine(c.bundle, c.task, c.objective, adv, c.sampler, seed=3, oversample=oversample)


def test_loss_mask_gives_given_cells_no_gradient(tmp_path):
    c = build(compose_cfg(["task.loss_mask=reward", "objective.beta=0"], tmp_path))
    items = c.task.splits.train[:2]
    ro = engine_of(c)(items, c.bundle.net, 0)
    for b in range(ro.completion_ids.shape[0]):
        pieces = c.bundle.tokenizer.batch_decode([[t] for t in ro.completion_ids[b].tolist()])
        assert ro.loss_mask[b].tolist() == [float(k) for k in c.task.reward_token_mask(ro.items[b], pieces)]
    assert 0 < ro.loss_mask.mean() < 1
    # d loss / d logits is exactly zero at the completion tokens the reward ignores
    net, P = c.bundle.net, ro.prompt_ids.shape[1]
    seen = []

    def forward(ids, attn, position_ids=None):
        logits = logits_fn(net)(ids, attn).detach().requires_grad_(True)
        seen.append(logits)
        return logits

    old = logits_fn(net)
    loss, _ = c.objective.loss(StepContext(ro, 0, 3, forward, old, None))
    loss.backward()
    grad = seen[-1].grad[:, P:].abs().sum(-1)  # (n, L)
    ignored = (ro.loss_mask == 0) & (ro.completion_mask > 0)
    assert bool(ignored.any()) and float(grad[ignored].sum()) == 0.0
    assert float(grad[ro.scored_mask > 0].sum()) > 0


def test_dynamic_sampling_keeps_the_groups_whose_rewards_differ(tmp_path):
    c = build(compose_cfg(["task.prompts_per_batch=4", "task.group_size=4"], tmp_path))
    items = c.task.splits.train[:8]
    full = engine_of(c)(items, c.bundle.net, 0)  # the same draws: the noise is keyed by rollout and row
    kept = engine_of(c, oversample=2)(items, c.bundle.net, 0)
    spread = full.rewards.view(-1, 4).std(-1) > 1e-6
    order = torch.cat([spread.nonzero()[:, 0], (~spread).nonzero()[:, 0]])[:4].sort().values
    rows = (order[:, None] * 4 + torch.arange(4)).reshape(-1)
    assert torch.equal(kept.completion_ids, full.completion_ids[rows])
    assert torch.equal(kept.rewards, full.rewards[rows]) and kept.texts == [full.texts[i] for i in rows.tolist()]
    assert kept.metrics["train/frac_zero_std_groups"] == pytest.approx(float((~spread).float().mean()))
    assert kept.advantages.shape == (16,) and kept.all_rewards.shape == (16,)
    with pytest.raises(ConfigError, match="rollout.oversample"):
        engine_of(c, oversample=3)(items, c.bundle.net, 0)  # 32 rows are not 3 x whole groups


def test_trajectory_select_keeps_each_samples_record(tiny_bundle):
    ids, mask = encode_prompts(tiny_bundle.tokenizer, ["1203=", "40", "0000000=", "12"])
    rec = TrajectoryRecorder(tiny_bundle.mask_token_id)
    generate(logits_fn(tiny_bundle.net.eval()), ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4,
             temperature=0.9), tiny_bundle.mask_token_id, torch.Generator().manual_seed(0), rec)
    rows = torch.tensor([3, 1])
    sub = rec.select(rows)
    assert torch.equal(sub.final, rec.final[rows]) and torch.equal(sub.entropies, rec.entropies[rows])
    for s in range(rec.num_steps):
        assert torch.equal(sub.state_before(s), rec.state_before(s)[rows])
        assert torch.equal(sub.greedy_completion(s), rec.greedy_completion(s)[rows])
