"""JustGRPO (rl/objectives/justgrpo.py): parity with a transcription of the public training step on
random tensors and on the tiny model's own left-to-right rollouts; the exact per-token log-probs
against the sampler's; the loss's invariants; the rollout sampler; the configs; two processes (slow).

The reference below is written from LeapLabTHU/JustGRPO @ eebe50e (``grpo.py``: ``logprob_loss``,
``compute_group_advantages``; ``train.py``: the step that splits each group into ``repeat_times``
chunks, counts ``valid_samples`` and accumulates), in its operations and order, and imports nothing
of the project's implementation. Data parallelism is simulated: ``accelerator.gather`` returns every
process's count, ``accelerator.backward`` adds the gradient divided by the number of processes (the
mean DDP and FSDP take) and accumulation steps add up. The public forward runs under bf16 autocast;
here everything is fp32.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.left_to_right import left_to_right_logps
from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.rl.advantages import AdvantageConfig, GroupStdAdvantage
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.justgrpo import JustGRPO, JustGRPOConfig, justgrpo_loss
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.sampling.sampler import completion_mask
from tests.helpers.common import compose_cfg

# ---------------------------------------------------------------- the public code, transcribed


def public_compute_group_advantages(rewards, group_size):
    """grpo.py L58-61."""
    mean = rewards.view(group_size, -1).mean(dim=0).repeat(group_size)
    std = rewards.view(group_size, -1).std(dim=0).repeat(group_size)
    return (rewards - mean) / (std + 1e-4)


def public_logprob_loss(model, inputs, valid_samples, eps=0.2, gain=1.0, temperature=1., accelerator=None,
                        gen_length=256, mask_id=126336):
    """grpo.py L25-55 (the returned metrics left out)."""
    advantages, generated_ids, prompt_len = inputs['advantages'], inputs['generated_ids'], inputs['prompt_len']
    batch_size, device = advantages.shape[0], generated_ids.device
    prompt_ids, completion_ids = generated_ids[:, :prompt_len], generated_ids[:, prompt_len:]

    valid_samples = accelerator.gather(valid_samples).float().mean().item()
    scale = gain / gen_length / (valid_samples + 1e-5)

    for t in range(gen_length):
        x = torch.cat([prompt_ids, completion_ids[:, :t],
                       torch.full((batch_size, gen_length - t), mask_id, device=device, dtype=generated_ids.dtype)], dim=1)
        logits = model(x).logits / temperature
        log_prob = F.log_softmax(logits[:, prompt_len + t, :].float(), dim=-1)
        token_log_prob = log_prob.gather(-1, completion_ids[:, t:t + 1]).squeeze(-1)
        ratio = (token_log_prob - token_log_prob.detach()).exp()
        clipped_ratio = ratio.clamp(1 - eps, 1 + eps)
        loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
        accelerator.backward(loss.mul(scale).sum())


class Accelerator:
    """One process of a simulated data-parallel step: ``counts`` every process's ``valid_samples``."""

    def __init__(self, counts, world, total):
        self.counts, self.world, self.total = counts, world, total

    def gather(self, x):
        return self.counts

    def backward(self, loss):
        (loss / self.world).backward()  # the processes' gradients are averaged
        self.total[0] += loss.item() / self.world


def public_step(model_of, prompts, completions, rewards, G, world, L, mask_id, repeat_times=2, mutation=None):
    """train.py L157-203 for one optimizer step: group ``a * world + p`` is process ``p``'s at
    accumulation step ``a`` (one prompt each, ``batch_size_per_device = 1``). ``model_of(g, rows)`` is
    the model as group ``g``'s rows ``rows`` see it. Returns the summed loss value (gradients land in
    ``.grad``). ``mutation`` makes one one-line change, to show the parity tests can fail."""
    total = [0.0]
    groups = len(prompts)
    for a in range(groups // world):
        members = [a * world + p for p in range(world)]
        advs = [public_compute_group_advantages(rewards[g], G) for g in members]
        valid = [(adv != 0).sum() for adv in advs]
        if mutation == "all_samples":  # every sample counts, A = 0 or not
            valid = [torch.tensor(G) for _ in members]
        counts = torch.stack(valid)
        for g, adv, v in zip(members, advs, valid):
            acc = Accelerator(counts if mutation != "own_count" else v[None], world, total)
            n = G // repeat_times
            for r in range(repeat_times):
                rows = torch.arange(r * n, (r + 1) * n)
                inputs = {"generated_ids": torch.cat([prompts[g].repeat(n, 1), completions[g][rows]], 1),
                          "prompt_len": prompts[g].shape[1], "advantages": adv[rows]}
                if mutation == "mean_over_steps":
                    inputs["advantages"] = inputs["advantages"] / (groups // world)
                public_logprob_loss(model_of(g, rows), inputs, v, accelerator=acc, gen_length=L, mask_id=mask_id)
    return total[0]


# ---------------------------------------------------------------- a model of random log-probs

MASK = 99


class TableModel:
    """Logits ``theta[rows, t]`` at position ``P + t`` where ``t`` completion tokens are revealed, so the
    public per-position loop reads ``log softmax(theta[i, t])[x_it]``: random log-probs with gradients."""

    def __init__(self, theta, rows, P):
        self.theta, self.rows, self.P = theta, rows, P

    def __call__(self, x):
        t = int((x[0, self.P:] != MASK).sum())
        logits = torch.zeros(x.shape[0], x.shape[1], self.theta.shape[-1])
        logits[:, self.P + t] = self.theta[self.rows, t]
        return SimpleNamespace(logits=logits)


def random_batch(groups=4, G=4, P=3, L=6, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, V, (1, P), generator=g) for _ in range(groups)]
    comps = [torch.randint(0, V, (G, L), generator=g) for _ in range(groups)]
    rewards = [(torch.rand(G, generator=g) < 0.5).float() * 2 - 1 for _ in range(groups)]
    rewards[1] = torch.ones(G)  # a group whose rewards agree: A = 0
    rewards[2] = torch.tensor([1.0, 0.0, -1.0, 0.0])[:G]  # two samples at the group mean: A = 0 beside A != 0
    theta = torch.randn(groups * G, L, V, generator=g)
    return prompts, comps, rewards, theta


def ours_on_table(theta, comps, rewards, G, norm_groups):
    """The project's loss on the same log-probs: (value, d/d theta)."""
    theta = theta.clone().requires_grad_(True)
    comp = torch.cat(comps)  # (B, L) prompt-major
    logp = theta.log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)  # (B, L)
    adv, _ = GroupStdAdvantage(AdvantageConfig())(torch.cat(rewards), G)
    loss, _ = justgrpo_loss(logp, None, adv[:, None], torch.ones_like(logp), JustGRPOConfig(norm_groups=norm_groups),
                            group_size=G)
    (grad,) = torch.autograd.grad(loss, theta)
    return loss.item(), grad


def public_on_table(theta, prompts, comps, rewards, G, world, mutation=None):
    theta = theta.clone().requires_grad_(True)
    P, L = prompts[0].shape[1], comps[0].shape[1]
    value = public_step(lambda g, rows: TableModel(theta, g * G + rows, P), prompts, comps, rewards, G, world, L, MASK,
                        mutation=mutation)
    return value, theta.grad


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("world", [1, 2, 4])
def test_loss_and_gradient_equal_the_public_step_on_random_tensors(world):
    """``norm_groups`` groups play the public processes of one accumulation step; the steps add up."""
    for seed in range(3):
        prompts, comps, rewards, theta = random_batch(seed=seed)
        ref_value, ref_grad = public_on_table(theta, prompts, comps, rewards, 4, world)
        value, grad = ours_on_table(theta, comps, rewards, 4, world)
        assert value == pytest.approx(ref_value, abs=1e-6, rel=1e-6)
        torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-6)
        assert grad[4:8].abs().sum() == 0  # the group whose rewards agree moves nothing


@pytest.mark.parametrize("mutation", ["all_samples", "own_count", "mean_over_steps"])
def test_one_line_changes_of_the_public_step_are_caught(mutation):
    """Counting every sample instead of those with A != 0, a process's own count instead of the mean
    over processes, or a mean over accumulation steps instead of their sum: each changes the gradient
    well beyond the parity tolerance, so the tests above would fail on it."""
    prompts, comps, rewards, theta = random_batch(seed=1)
    rewards[0] = torch.tensor([1.0, -1.0, -1.0, -1.0])  # counts 4, 0, 2, 4: the processes of a step differ
    rewards[3] = torch.tensor([-1.0, 1.0, 1.0, 1.0])
    _, ref_grad = public_on_table(theta, prompts, comps, rewards, 4, 2, mutation=mutation)
    _, grad = ours_on_table(theta, comps, rewards, 4, 2)
    assert (grad - ref_grad).abs().max() > 1e-3 * grad.abs().max()


def justgrpo_setup(tmp_path, extra=(), groups=4):
    """The objective from the configs and a rollout of the (untrained) tiny model through the rollout
    engine, with +-1 rewards of four kinds of group (one whose rewards agree)."""
    torch.manual_seed(0)  # the model's initialisation
    c = build(compose_cfg(["objective=justgrpo", f"task.prompts_per_batch={groups}", *extra], tmp_path))
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = engine(c.task.splits.train[:groups], c.bundle.net, 0)
    rewards = torch.tensor([1, -1, -1, -1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, 1], dtype=torch.float)[:groups * 4]
    adv, _ = c.advantage(rewards, ro.group_size)
    return c, replace(ro, rewards=rewards, all_rewards=rewards, advantages=adv)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_loss_and_gradient_equal_the_public_step_on_the_tiny_models_rollouts(tmp_path, world):
    """The objective's loss on the tiny model's left-to-right rollout equals the public step that runs
    one forward per position, values and gradients (the public code knows no pinned tokens: givens off)."""
    c, ro = justgrpo_setup(tmp_path, ["task.pin_givens=false", f"objective.norm_groups={world}"])
    net = c.bundle.net.eval()
    G, P, L = ro.group_size, ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    assert bool(ro.prompt_mask.all())  # one prompt per process: no padding, the public forward has no mask
    rewards = list(ro.rewards.view(-1, G))
    torch.testing.assert_close(torch.cat([public_compute_group_advantages(r, G) for r in rewards]), ro.advantages)
    params = list(net.parameters())
    loss, _ = c.objective.loss(StepContext(ro, 0, 3, logits_fn(net), None, None))
    g_ours = torch.autograd.grad(loss, params)

    prompts = [ro.prompt_ids[g * G:g * G + 1] for g in range(len(rewards))]
    comps = [ro.completion_ids[g * G:(g + 1) * G] for g in range(len(rewards))]
    forward = logits_fn(net)
    value = public_step(lambda g, rows: (lambda x: SimpleNamespace(logits=forward(x, None))), prompts, comps, rewards,
                        G, world, L, c.bundle.mask_token_id)
    assert loss.item() == pytest.approx(value, abs=1e-6, rel=1e-6)
    for a, p in zip(g_ours, params):
        torch.testing.assert_close(a, p.grad, atol=1e-6, rtol=1e-5)
    assert P == ro.prompt_ids.shape[1] and any(a.abs().max() > 0 for a in g_ours)


# ---------------------------------------------------------------- the exact log-probs


def test_the_scores_are_the_samplers_own_log_probs(tmp_path):
    """On the default Sudoku job (givens pinned), each scored token's exact log-prob is the one the
    sampler drew it with: its rollouts decode left to right. The control: the configured sampler's
    rollouts (blocks of 16 by confidence) were drawn from other inputs, and the same scoring misses them."""
    c, ro = justgrpo_setup(tmp_path, groups=2)
    assert ro.pinned is not None and bool(ro.pinned.any())
    net = c.bundle.net.eval()
    s = c.objective.logp_units(StepContext(ro, 0, 3, logits_fn(net), None, None), logits_fn(net), "policy")
    scored = s.mask.bool()
    assert not bool((scored & ro.pinned).any()) and bool(scored.sum(-1).eq((~ro.pinned).sum(-1)).all())
    torch.testing.assert_close(s.logp[scored], ro.sampler_logp[scored], atol=1e-5, rtol=0)

    grpo = build(compose_cfg(["objective=grpo", "task.prompts_per_batch=2"], tmp_path))
    other = RolloutEngine(grpo.bundle, grpo.task, grpo.objective, grpo.advantage, grpo.sampler, seed=3)(
        c.task.splits.train[:2], net, 0)
    lp = left_to_right_logps(logits_fn(net), other.prompt_ids, other.prompt_mask, other.completion_ids,
                             ~other.pinned, c.bundle.mask_token_id, other.pinned)
    assert (lp - other.sampler_logp)[~other.pinned].abs().max() > 1e-3


@pytest.mark.parametrize("rows_per_forward", [1, 5])
def test_rows_per_forward_changes_nothing(tmp_path, rows_per_forward):
    """Chunked and checkpointed rows give the loss and gradients of one forward over every row."""
    c, ro = justgrpo_setup(tmp_path, groups=2)
    net = c.bundle.net.eval()
    params = list(net.parameters())
    obj = JustGRPO(replace(c.objective.cfg, rows_per_forward=rows_per_forward), c.objective.likelihood)
    ctx = StepContext(ro, 0, 3, logits_fn(net), None, None)
    one, _ = c.objective.loss(ctx)
    chunked, _ = obj.loss(ctx)
    assert chunked.item() == pytest.approx(one.item(), abs=1e-7)
    for a, b in zip(torch.autograd.grad(one, params), torch.autograd.grad(chunked, params)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_tokens_all_scores_past_the_first_eos_and_scored_does_not(tmp_path):
    c, ro = justgrpo_setup(tmp_path, ["task.pin_givens=false"], groups=2)
    comp = ro.completion_ids.clone()
    comp[0, 3] = c.bundle.eos_token_id  # Sudoku answers fill all 16 positions
    ro = replace(ro, completion_ids=comp, completion_mask=completion_mask(comp, c.bundle.eos_token_id))
    net = c.bundle.net.eval()
    ctx = StepContext(ro, 0, 3, logits_fn(net), None, None)
    every = c.objective.logp_units(ctx, logits_fn(net), "policy")
    upto = JustGRPO(replace(c.objective.cfg, tokens="scored"), c.objective.likelihood).logp_units(ctx, logits_fn(net), "policy")
    assert every.mask.sum() == comp.numel() and torch.equal(upto.mask, ro.completion_mask) and upto.mask[0].sum() <= 4
    assert bool((every.logp[0, 4:] != 0).all()) and bool((upto.logp[0, 4:] == 0).all())
    torch.testing.assert_close(every.logp * upto.mask, upto.logp)


# ---------------------------------------------------------------- invariants


def test_gradient_equals_the_formula():
    """d loss = sum_c sum_{i in c} -A_i sum_t d lp_it / (L (V_c + k_c 1e-5)); a last short chunk counts its own groups."""
    torch.manual_seed(1)
    B, L, D, G = 20, 5, 4, 4  # 5 groups: chunks of 2, 2, 1
    feats = torch.randn(B, L, D)
    theta = torch.randn(D, requires_grad=True)
    mask = (torch.arange(L)[None] < torch.randint(1, L + 1, (B, 1))).float()
    adv = torch.randn(B)
    adv[4:8] = 0  # a group whose rewards agree
    adv[13] = 0
    loss, m = justgrpo_loss(feats @ theta, None, adv[:, None], mask, JustGRPOConfig(norm_groups=2), group_size=G)
    loss.backward()
    chunk = torch.arange(B) // (2 * G)
    V = torch.tensor([float(((adv != 0) & (chunk == c)).sum()) for c in range(3)])
    k = torch.tensor([2.0, 2.0, 1.0])
    denom = L * (V + k * 1e-5)  # (3,)
    expected = (-(adv / denom[chunk])[:, None] * (feats * mask[..., None]).sum(1)).sum(0)
    torch.testing.assert_close(theta.grad, expected, atol=1e-6, rtol=1e-6)
    assert m["justgrpo/nonzero_adv_frac"].item() == pytest.approx(15 / 20)


def test_zero_advantage_groups_neither_move_nor_dilute():
    """A group whose advantages are 0 gets no gradient and, beside the 1e-5, leaves the other rows' as they are."""
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(8, 6, generator=g)
    adv = torch.randn(8, generator=g)
    mask = torch.ones(8, 6)
    a = logp.clone().requires_grad_(True)  # two groups, each its own chunk
    justgrpo_loss(a, None, adv[:, None], mask, JustGRPOConfig(norm_groups=1), group_size=4)[0].backward()
    both = torch.cat([logp[:4], logp[:4], logp[4:], logp[4:]]).requires_grad_(True)  # each beside a zero-advantage group
    justgrpo_loss(both, None, torch.cat([adv[:4], torch.zeros(4), adv[4:], torch.zeros(4)])[:, None],
                  torch.ones(16, 6), JustGRPOConfig(norm_groups=2), group_size=4)[0].backward()
    torch.testing.assert_close(both.grad[0:4], a.grad[0:4], rtol=1e-4, atol=0)
    torch.testing.assert_close(both.grad[8:12], a.grad[4:8], rtol=1e-4, atol=0)
    assert both.grad[4:8].abs().sum() == 0 and both.grad[12:].abs().sum() == 0
    zero = logp.clone().requires_grad_(True)
    loss, _ = justgrpo_loss(zero, None, torch.zeros(8, 1), mask, JustGRPOConfig(), group_size=4)
    loss.backward()
    assert loss.item() == 0 and zero.grad.abs().sum() == 0


def test_ratio_is_one_nothing_depends_on_the_value_of_logp():
    """Value -sum A * scale per scored token whatever lp is (the public code's); the gradient is linear in A."""
    lp = -torch.rand(4, 3) * 5
    adv = torch.tensor([1.0, -1.0, 2.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]).float()
    cfg = JustGRPOConfig()
    loss, _ = justgrpo_loss(lp, None, adv[:, None], mask, cfg, group_size=4)
    scale = 1 / (3 * 1 * (3 + 1e-5))
    assert loss.item() == pytest.approx(-(1 * 3 - 1 * 1 + 2 * 2) * scale, rel=1e-6)
    shifted, _ = justgrpo_loss(lp - 7.0, None, adv[:, None], mask, cfg, group_size=4)
    assert shifted.item() == loss.item()
    x = lp.clone().requires_grad_(True)
    justgrpo_loss(x, None, 3 * adv[:, None], mask, cfg, group_size=4)[0].backward()
    torch.testing.assert_close(x.grad, -3 * adv[:, None] * mask * scale)


def test_all_masked_and_extreme_values_stay_finite():
    logp = torch.full((4, 6), -80.0, requires_grad=True)
    mask = torch.zeros(4, 6)
    mask[1] = 1
    loss, m = justgrpo_loss(logp, logp.detach() + 3, torch.tensor([[1e4], [-1e4], [0.0], [5.0]]), mask,
                            JustGRPOConfig(), group_size=4)
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(logp.grad).all()) and all(bool(torch.isfinite(v)) for v in m.values())
    assert logp.grad[0].abs().sum() == 0  # nothing of an unscored row
    empty = left_to_right_logps(lambda ids, attn: torch.randn(ids.shape[0], ids.shape[1], 5, requires_grad=True),
                                torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), torch.zeros(2, 4, dtype=torch.long),
                                torch.zeros(2, 4, dtype=torch.bool), 4)
    assert empty.shape == (2, 4) and bool((empty == 0).all()) and empty.requires_grad  # still on the graph


def test_the_ratio_diagnostic_reads_the_samplers_log_probs_and_costs_no_forward(tmp_path):
    from diffusion_rl.training.module import DiffusionRLModule

    c, ro = justgrpo_setup(tmp_path, groups=2)

    def no_old(*args, **kwargs):
        raise AssertionError("the old policy was scored")

    _, m = c.objective.loss(StepContext(ro, 0, 3, logits_fn(c.bundle.net.eval()), no_old, None))
    assert max(abs(m["ratio/log_min"].item()), abs(m["ratio/log_max"].item())) < 1e-5  # theta = the rollout's
    assert "rollout/mismatch_log_ratio" not in m
    off = build(compose_cfg(["objective=justgrpo", "objective.ratio_diagnostic=false"], tmp_path))
    _, m = off.objective.loss(StepContext(ro, 0, 3, logits_fn(c.bundle.net), no_old, None))
    assert not any(k.startswith("ratio/") for k in m)
    module = DiffusionRLModule(off.bundle, off.task, off.objective, off.advantage, off.sampler, off.optim, 0)
    assert module.old_policy is None


# ---------------------------------------------------------------- rollouts and configs


def test_rollouts_decode_left_to_right_and_evaluation_keeps_the_configured_sampler(tmp_path):
    c = build(compose_cfg(["objective=justgrpo", "sampler.kv_cache=dual", "sampler.cfg_scale=0"], tmp_path))
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler)
    s = engine.sampler
    assert (s.block_length, s.steps, s.temperature, s.decode, s.kv_cache, s.cfg_scale) == (1, 16, 1.0, "fixed", "none", 0.0)
    assert (c.sampler.block_length, c.sampler.temperature, c.sampler.kv_cache) == (16, 0.9, "dual")  # the evaluation's
    grpo = build(compose_cfg(["objective=grpo"], tmp_path))
    assert grpo.objective.rollout_sampler(grpo.sampler) is grpo.sampler  # other objectives roll out as configured


def test_the_yaml_selects_the_public_regime(tmp_path):
    cfg = compose_cfg(["objective=justgrpo", "~testbed"], tmp_path)
    assert cfg.advantage.name == "group_std" and cfg.advantage.eps == 1e-4
    assert cfg.optim.lr == 5e-6 and list(cfg.optim.betas) == [0.9, 0.999]
    assert cfg.optim.weight_decay == 0 and cfg.optim.grad_clip == 1.0
    c = build(cfg)
    assert c.objective.cfg.mu == 1 and c.objective.cfg.beta == 0 and c.objective.cfg.norm_groups == 8


@pytest.mark.parametrize("override, key", [
    (dict(norm_groups=0), "objective.norm_groups"), (dict(tokens="eos"), "objective.tokens"),
    (dict(rows_per_forward=-1), "objective.rows_per_forward"),
    (dict(behaviour_correction="tis"), "objective.behaviour_correction"),
])
def test_nonsense_options_fail_in_one_line(override, key):
    with pytest.raises(ConfigError) as err:
        JustGRPOConfig(**override).validate()
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, key", [
    (["likelihood=elbo"], "likelihood.name"), (["advantage=per_token"], "advantage.credit"),
    (["model=tiny_block", "sampler.steps=8"], "model.block_size"),
    (["sampler.stop_after_eos=true"], "sampler.stop_after_eos"),
])
def test_wrong_pieces_fail_at_start_up_in_one_line(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as err:
        build(compose_cfg(["objective=justgrpo", *overrides], tmp_path))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
    if key == "sampler.stop_after_eos":  # with the scored tokens only, the filled EOS are never read
        build(compose_cfg(["objective=justgrpo", *overrides, "objective.tokens=scored"], tmp_path))


# ---------------------------------------------------------------- two processes


def _loss_on(shard):
    """The loss of one left-to-right rollout of 3 groups of 4 (the second spanning both halves, chunks
    of 2 groups), computed by the process ``shard`` describes from its own rows."""
    from diffusion_rl.likelihood.base import LikelihoodConfig
    from diffusion_rl.likelihood.one_step import OneStepEstimator
    from diffusion_rl.models.build import build_policy
    from diffusion_rl.models.policy import ModelConfig
    from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
    from tests.helpers.common import rollout_of

    torch.manual_seed(0)
    bundle = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))
    ids, pmask = encode_prompts(bundle.tokenizer, [p for p in ["1203=", "4021=", "3300="] for _ in range(4)])
    net = bundle.net.eval()
    out = generate(logits_fn(net), ids, pmask, SamplerConfig(gen_length=8, block_length=1, steps=8, temperature=1.0),
                   bundle.mask_token_id, RowNoise.rows(3, 0, ids.shape[0]))
    rewards = torch.tensor([1.0, -1, -1, -1, 1, 1, -1, 0, -1, -1, -1, -1])
    adv, _ = GroupStdAdvantage(AdvantageConfig())(rewards, 4)
    rows = shard.rows(ids.shape[0])
    ro = rollout_of(ids[rows], pmask[rows], out.completion[rows], completion_mask(out.completion, bundle.eos_token_id)[rows],
                    rewards[rows], adv[rows], 4, shard=shard, sampler_logp=out.token_logp[rows])
    ro = replace(ro, all_rewards=rewards)
    obj = JustGRPO(JustGRPOConfig(norm_groups=2), OneStepEstimator(LikelihoodConfig(), bundle.mask_token_id))
    loss, m = obj.loss(StepContext(ro, 0, 0, logits_fn(net), None, None))
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
    return loss.item(), m["justgrpo/nonzero_adv_frac"].item(), grad * shard.world_size  # the module's scaling


def _ddp_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    from diffusion_rl.core.distributed import Shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(_loss_on(Shard(rank, world, rank * 12 // world)), f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_give_the_one_process_loss_and_gradient(tmp_path):
    """Gloo, two processes with 6 rows each: the chunks are cut by global group, so each process computes
    the one-process loss, and the gradients its rows give (times 2, averaged by the strategy) sum to it."""
    import torch.multiprocessing as mp

    from diffusion_rl.core.distributed import Shard

    loss, frac, grad = _loss_on(Shard())
    assert frac == pytest.approx(8 / 12)  # the third group agrees
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / f"{rank}.pt") for rank in range(2)]
    for two_loss, two_frac, _ in parts:
        assert two_loss == pytest.approx(loss, abs=1e-7) and two_frac == frac
    torch.testing.assert_close((parts[0][2] + parts[1][2]) / 2, grad, atol=1e-7, rtol=1e-5)


# ---------------------------------------------------------------- what the first mutation run left unchecked


def test_per_token_advantages_are_refused_in_justgrpos_name():
    """JustGRPO weighs whole samples: (B, L) advantages are refused, and the error says which objective refused."""
    with pytest.raises(ValueError, match=r"^justgrpo\b"):
        justgrpo_loss(-torch.rand(4, 3), None, torch.randn(4, 3), torch.ones(4, 3), JustGRPOConfig(), group_size=2)


def test_the_loss_and_ratios_are_float32_whatever_the_log_probs_dtype():
    """The public code's fp32 log-softmax: log-probs in float64 are read in float32 (a float32 loss)."""
    lp = -torch.rand(4, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    loss, m = justgrpo_loss(lp, lp + 0.5, torch.tensor([[1.0], [-1.0], [2.0], [0.5]]), mask, JustGRPOConfig(), group_size=4)
    assert loss.dtype == torch.float32
    assert m["ratio/log_mean"].dtype == torch.float32 and m["ratio/log_mean"].item() == pytest.approx(-0.5)


def test_tokens_per_sample_is_the_mean_count_of_scored_positions_per_sample():
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])  # 3, 1, 5, 0
    _, m = justgrpo_loss(torch.zeros(4, 5), None, torch.ones(4, 1), mask, JustGRPOConfig(), group_size=2)
    assert m["justgrpo/tokens_per_sample"].item() == pytest.approx(9 / 4)


def test_the_rollout_decoding_replaces_every_option_of_the_configured_sampler():
    """One token per block and step at temperature 1, fixed counts, no cache, no guidance, confidence
    remasking (moot with one position per block): whatever the configured sampler said."""
    from diffusion_rl.likelihood.base import LikelihoodConfig
    from diffusion_rl.likelihood.one_step import OneStepEstimator
    from diffusion_rl.sampling.sampler import SamplerConfig

    configured = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.3, decode="threshold",
                               kv_cache="dual", cfg_scale=1.5, remasking="random")
    s = JustGRPO(JustGRPOConfig(), OneStepEstimator(LikelihoodConfig(), MASK)).rollout_sampler(configured)
    assert (s.gen_length, s.block_length, s.steps, s.temperature) == (12, 1, 12, 1.0)
    assert (s.decode, s.kv_cache, s.cfg_scale, s.remasking) == ("fixed", "none", 0.0, "low_confidence")


def test_the_old_log_probs_are_the_samplers_on_the_scored_positions_and_0_elsewhere(tmp_path):
    """With the givens pinned (never scored) and tokens=scored, compute_old_logp is the sampler's
    recorded log-prob where a token is scored and 0 where it is not, as the policy's units are."""
    c, ro = justgrpo_setup(tmp_path, groups=2)
    comp = ro.completion_ids.clone()
    free = (~ro.pinned[0]).nonzero()[:, 0]
    comp[0, free[1]] = c.bundle.eos_token_id  # the first row ends at its second free position
    ro = replace(ro, completion_ids=comp, completion_mask=completion_mask(comp, c.bundle.eos_token_id))
    for tokens in ("all", "scored"):
        obj = JustGRPO(replace(c.objective.cfg, tokens=tokens), c.objective.likelihood)
        ctx = StepContext(ro, 0, 3, logits_fn(c.bundle.net), None, None)
        scored = obj.tokens(ctx).bool()
        old = obj.compute_old_logp(ctx)
        assert torch.equal(old[scored], ro.sampler_logp[scored]) and bool((old[~scored] == 0).all()), tokens
        assert bool(ro.pinned.any()) and not bool(scored[ro.pinned].any())
    assert bool((scored[0, free[2]:] == 0).all())  # tokens=scored: nothing past the first row's EOS


def test_without_recorded_log_probs_the_old_policy_scores_the_same_positions(tmp_path):
    """A rollout without the sampler's log-probs: the old policy's left-to-right log-probs, one input per
    scored position, as the policy's are scored; the ratio diagnostic reads them."""
    import copy

    c, ro = justgrpo_setup(tmp_path, groups=2)
    ro = replace(ro, sampler_logp=None)
    net = c.bundle.net.eval()
    old_net = copy.deepcopy(net)
    with torch.no_grad():
        for p in old_net.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    ctx = StepContext(ro, 0, 3, logits_fn(net), logits_fn(old_net), None)
    with torch.no_grad():
        old = c.objective.compute_old_logp(ctx)
        want = left_to_right_logps(logits_fn(old_net), ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ~ro.pinned,
                                   c.bundle.mask_token_id, ro.pinned)
        policy = left_to_right_logps(logits_fn(net), ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ~ro.pinned,
                                     c.bundle.mask_token_id, ro.pinned)
    torch.testing.assert_close(old, want)
    _, m = c.objective.loss(ctx)
    assert m["ratio/log_mean"].item() == pytest.approx((policy - want)[~ro.pinned].mean().item(), abs=1e-5)


def test_at_the_first_update_the_old_log_probs_are_still_the_samplers(tmp_path):
    """While the policy holds the rollout policy's weights (policy_is_old), the other objectives take the
    policy's own detached log-probs as the old ones; JustGRPO's are the sampler's, so the diagnostic
    still measures the policy against the sampler (here a sampler off by a known amount per token)."""
    c, ro = justgrpo_setup(tmp_path, groups=2)
    scored = ~ro.pinned
    shift = torch.linspace(-0.5, 0.7, ro.sampler_logp.numel()).view_as(ro.sampler_logp) * scored
    ro = replace(ro, sampler_logp=ro.sampler_logp + shift)
    f = logits_fn(c.bundle.net.eval())
    _, m = c.objective.loss(StepContext(ro, 0, 3, f, None, None, policy_is_old=True))
    assert m["ratio/log_mean"].item() == pytest.approx(-shift[scored].mean().item(), abs=1e-4)
    assert m["ratio/log_min"].item() == pytest.approx(-shift[scored].max().item(), abs=1e-4)
