"""CJ-GRPO: parity with a transcription of the public loss (yjyddq/EOSER-ASS-RL @ 5affb4e) on random
tensors and on the tiny models' own recorded rollouts (semi-AR, EOSER + ASS, a block model), values and
gradients; the reductions that would differ; the loss's invariants; the rows and the old log-probs; the
config errors and the yaml.

The reference below is written for this test from ``cj-grpo/cj_grpo_trainer_semiar.py``
(``compute_loss`` L84-151, ``_get_per_token_logps`` L398-434, the recording in ``reversed_process``
L261-360 and the advantages L580-597) in the same tensor operations and order, and imports nothing of
``rl/objectives/cj_grpo.py``. The public trainer runs one micro-batch of one group (G rows) through
``compute_loss``; the reference loss of a batch is the mean of its groups' losses, as gradient
accumulation and data parallelism average them.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, encode_prompts, logits_fn
from diffusion_rl.rl.advantages import GroupAdvantage, GroupConfig
from diffusion_rl.rl.objectives.base import StepContext, kl_penalty
from diffusion_rl.rl.objectives.cj_grpo import CJGRPO, CJGRPOConfig, cj_grpo_loss, transition_mean
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.block import block_generate
from diffusion_rl.sampling.sampler import completion_mask
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from tests.helpers.common import compose_cfg, rollout_of

EPS, BETA = 0.5, 0.04  # train.yaml


# ======================================================================= the public code, transcribed
def ref_compute_loss(traj_logps, traj_old, traj_ref, traj_unmask, advantages, eps=EPS, beta=BETA, num_iterations=12):
    """compute_loss of one micro-batch, from the per-transition log-probs on; returns the loss (and
    mean_kl, clip_ratio as the public code logs them)."""
    steps = len(traj_unmask)
    loss = torch.tensor(0.0)
    mean_kl = torch.tensor(0.0)
    clip_ratio = torch.tensor(0.0)
    for i in range(steps):
        per_token_logps = traj_logps[i]
        if beta != 0.0:
            ref_per_token_logps = traj_ref[i]
            per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        old_per_token_logps = traj_old[i] if num_iterations > 1 else per_token_logps.detach()
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
        per_token_loss1 = coef_1 * advantages.unsqueeze(1)
        per_token_loss2 = coef_2 * advantages.unsqueeze(1)
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        unmask_positions = traj_unmask[i]
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * per_token_kl
            mean_kl += (per_token_kl * unmask_positions).sum() / unmask_positions.sum() / steps
        is_clipped = (per_token_loss1 < per_token_loss2).float()
        clip_ratio += (is_clipped * unmask_positions).sum() / unmask_positions.sum() / steps
        loss += (per_token_loss * unmask_positions).sum() / unmask_positions.sum() / steps
    return loss, mean_kl, clip_ratio


def ref_get_per_token_logps(model, reversed_traj, reversed_traj_unmask_positions, logits_to_keep):
    """_get_per_token_logps: one forward of each recorded state, targets the next state."""
    out = []
    for i in range(len(reversed_traj_unmask_positions)):
        prompt_ids = reversed_traj[i]
        completion_ids = reversed_traj[i + 1]
        logits = model(prompt_ids)
        completion_logits = logits[:, -logits_to_keep:, :]
        completion_targets = completion_ids[:, -logits_to_keep:]
        per_token_logps = torch.gather(completion_logits.float().log_softmax(-1), -1,
                                       completion_targets.unsqueeze(-1)).squeeze(-1)  # selective_log_softmax
        out.append(per_token_logps)
    return out


def ref_advantages(rewards, num_generations):
    """L580-597: rewards minus the group mean (the std is computed for a metric only)."""
    mean_grouped_rewards = rewards.view(-1, num_generations).mean(dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    return rewards - mean_grouped_rewards


class PublicRecorder:
    """reversed_process's recording: ``reversed_traj`` (x_0, then x after every step) and
    ``mask_index & (x != mask_id)`` per step, from what the sampler passes a recorder."""

    def __init__(self, mask_id, L, inner=None):
        self.mask_id, self.L, self.inner = mask_id, L, inner
        self.traj, self.unmask = [], []

    def on_step(self, step, x_before, logits, candidates, committed):
        x = torch.where(committed, candidates, x_before)
        if not self.traj:
            self.traj.append(x_before.clone())
        self.traj.append(x.clone())
        self.unmask.append(((x_before == self.mask_id) & (x != self.mask_id))[:, -self.L:])
        if self.inner is not None:
            self.inner.on_step(step, x_before, logits, candidates, committed)


def ref_dare_sample_loss(step_values, step_mask):
    """DARE's reduction (tests/test_cj_grpo_paper_exact.py, paper_exact_cj_loss, one block): per sample,
    the token mean of each transition that holds a token, their mean, then the mean over samples."""
    sample_losses = []
    for b in range(step_values.size(0)):
        transition_losses = [step_values[b, k, step_mask[b, k]].mean() for k in range(step_values.size(1))
                             if step_mask[b, k].any()]
        sample_losses.append(torch.stack(transition_losses).mean())
    return torch.stack(sample_losses).mean()


def ref_token_mean_loss(step_values, step_mask):
    """Not the public reduction: one token mean over every (transition, token) of the batch."""
    return step_values[step_mask].mean()


# ======================================================================= helpers
def random_case(groups=3, G=4, T=5, L=7, seed=0, scale=0.4):
    """Per-transition log-probs (N, T, L) and a trajectory: each position unmasked at one random step
    (some never), every transition of every group unmasking a token."""
    g = torch.Generator().manual_seed(seed)
    N = groups * G
    new = -torch.rand(N, T, L, generator=g) * 3
    old = new + scale * torch.randn(N, T, L, generator=g)
    ref = new + scale * torch.randn(N, T, L, generator=g)
    step = torch.randint(0, T, (N, L), generator=g)
    step[:, :T] = torch.arange(T)  # every transition unmasks a token of every sample
    never = torch.rand(N, L, generator=g) < 0.15
    never[:, :T] = False
    mask = (step[:, None, :] == torch.arange(T)[None, :, None]) & ~never[:, None, :]  # (N, T, L)
    rewards = torch.rand(N, generator=g)
    return new, old, ref, mask, ref_advantages(rewards, G)


def public_batch_loss(new, old, ref, mask, adv, G, **kw):
    """Mean over groups of the public compute_loss, each group a micro-batch."""
    losses = []
    for s in range(0, new.shape[0], G):
        rows = slice(s, s + G)
        T = new.shape[1]
        losses.append(ref_compute_loss([new[rows, k] for k in range(T)], [old[rows, k] for k in range(T)],
                                       [ref[rows, k] for k in range(T)], [mask[rows, k].float() for k in range(T)],
                                       adv[rows], **kw)[0])
    return torch.stack(losses).mean()


def ours(new, old, ref, mask, adv, G, cfg=None, beta=BETA):
    """cj_grpo_loss + beta * the KL reduced as the objective's kl_term does."""
    cfg = cfg or CJGRPOConfig()
    loss, metrics = cj_grpo_loss(new, old, adv[:, None, None], mask.float(), cfg, group_size=G)
    kl = transition_mean(kl_penalty(new, ref), mask, G if cfg.agg == "group" else 1)
    return loss + beta * kl, metrics


def objective_of(bundle=None, **kw):
    obj = CJGRPO(CJGRPOConfig(**kw), OneStepEstimator(LikelihoodConfig(), 1 if bundle is None else bundle.mask_token_id))
    if bundle is not None:
        obj.bind(bundle)
    return obj


def perturbed(net, seed=5, scale=0.05):
    new = copy.deepcopy(net)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return new.eval()


GROUPS = [[1, 0, 0, 0], [1, 1, 0, 1], [0.5, 0, 1, 0]]  # one group per prompt, rewards that differ
DECODERS = {  # the public decoders on 8 tokens: semi-AR (2 blocks of 4, 4 steps each) and EOSER + ASS
    "semi-ar": dict(gen_length=8, block_length=4, steps=8),
    "eoser-ass": dict(gen_length=8, block_length=8, steps=3, schedule="ass", eos_gamma_min=0.01),
}


def masked_rollout(bundle, decoder="semi-ar", G=4, seed=3, groups=3, pin=False):
    """The tiny masked model's rollout with both recorders: ours and the public code's lists. ``pin``:
    row ``j`` of a group starts with its first ``j`` completion tokens given (a task's pinned tokens),
    so the rows of a group unmask different numbers of tokens at a transition."""
    prompts = ["1203=", "4021=", "3300="][:groups]  # one length: the public LLaDA forward has no mask
    ids, pmask = encode_prompts(bundle.tokenizer, [p for p in prompts for _ in range(G)])
    cfg = SamplerConfig(temperature=1.0, **DECODERS[decoder])
    canvas = pinned = None
    if pin:
        pos = torch.arange(cfg.gen_length)[None, :]
        pinned = pos < (torch.arange(ids.shape[0]) % G)[:, None]  # (n, L)
        canvas = torch.where(pinned, 7, bundle.mask_token_id)
    rec = TrajectoryRecorder(bundle.mask_token_id, record_greedy=False)
    public = PublicRecorder(bundle.mask_token_id, cfg.gen_length, rec)
    out = generate(logits_fn(bundle.net.eval()), ids, pmask, cfg, bundle.mask_token_id,
                   RowNoise.rows(seed, 0, ids.shape[0]), public, eos_id=bundle.eos_token_id, canvas=canvas)
    rewards = torch.tensor([float(x) for grp in GROUPS[:groups] for x in grp])
    adv, _ = GroupAdvantage(GroupConfig())(rewards, G)
    ro = rollout_of(ids, pmask, out.completion, completion_mask(out.completion, bundle.eos_token_id), rewards, adv, G,
                    trajectory=rec, sampler_logp=out.token_logp, pinned=pinned)
    return ro, public, out


def early_eos_rollout(bundle, decoder="semi-ar", pin=False):
    """:func:`masked_rollout` at the first seed where a completion ends before its last token."""
    for seed in range(3, 60):
        ro, public, out = masked_rollout(bundle, decoder, seed=seed, pin=pin)
        if (ro.completion_mask == 0).any():
            return ro, public, out
    pytest.fail("no seed gave a completion that ends early")


# ======================================================================= 1. parity, random tensors
def test_loss_and_gradient_equal_the_public_loss_on_random_tensors():
    for seed in range(3):
        new, old, ref, mask, adv = random_case(seed=seed)
        a = new.clone().requires_grad_(True)
        b = new.clone().requires_grad_(True)
        loss, _ = ours(a, old, ref, mask, adv, 4)
        public = public_batch_loss(b, old, ref, mask, adv, 4)
        (ga,) = torch.autograd.grad(loss, a)
        (gb,) = torch.autograd.grad(public, b)
        assert loss.item() == pytest.approx(public.item(), abs=1e-6, rel=1e-6)
        torch.testing.assert_close(ga, gb, atol=1e-7, rtol=1e-6)
        assert ga.abs().sum() > 0 and ga[~mask].abs().sum() == 0  # only unmasked tokens carry gradient


def test_a_different_reduction_gives_a_different_loss():
    """The one-line changes a port could make (DARE's per-sample means, one token mean over the batch)
    give another value on the same inputs; ``agg=sample`` is DARE's, exactly."""
    new, old, ref, mask, adv = random_case(seed=4)
    public = public_batch_loss(new, old, ref, mask, adv, 4, beta=0.0)
    group, _ = ours(new, old, ref, mask, adv, 4, beta=0.0)
    assert group.item() == pytest.approx(public.item(), abs=1e-6)
    ratio = torch.exp(new - old)
    values = -torch.min(ratio * adv[:, None, None], ratio.clamp(1 - EPS, 1 + EPS) * adv[:, None, None])
    dare = ref_dare_sample_loss(values, mask)
    sample, _ = ours(new, old, ref, mask, adv, 4, cfg=CJGRPOConfig(agg="sample"), beta=0.0)
    assert sample.item() == pytest.approx(dare.item(), abs=1e-6)
    for other in (dare, ref_token_mean_loss(values, mask)):
        assert abs(other.item() - public.item()) > 1e-4  # 100 times the parity tolerance


def test_advantages_are_rewards_minus_the_group_mean():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.2, 0.2, 0.2, 0.2, 0.0, 1.0, 1.0, 1.0])
    adv, _ = GroupAdvantage(GroupConfig())(rewards, 4)
    torch.testing.assert_close(adv, ref_advantages(rewards, 4))


# ======================================================================= 2. parity, real rollouts
@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_loss_and_gradient_equal_the_public_code_on_a_recorded_rollout(tiny_bundle, decoder):
    """The tiny model's own rollout (temperature 1), policy, old and reference models that differ: the
    objective's loss equals the public pipeline's (recorded states -> per-transition log-probs of the
    three models -> compute_loss per group -> mean), and so do the gradients. The rollout holds tokens
    after a first EOS (trained, as there) and rows that unmask different numbers of tokens at a
    transition (pinned tokens: the group's token mean is then not the mean of its samples')."""
    bundle = tiny_bundle
    ro, public, out = early_eos_rollout(bundle, decoder, pin=True)
    counts = torch.stack(public.unmask, 1).sum(-1)  # (n, T) tokens each transition unmasked
    per_group = counts.view(-1, ro.group_size, counts.shape[1])
    assert (per_group.amax(1) != per_group.amin(1)).any()
    old_net, new_net, ref_net = bundle.net.eval(), perturbed(bundle.net, 5), perturbed(bundle.net, 9)
    obj = objective_of(bundle)
    ctx = StepContext(ro, 1, 0, logits_fn(new_net), logits_fn(old_net), logits_fn(ref_net))  # an update after the first
    loss, metrics = obj.loss(ctx)
    params = list(new_net.parameters())
    g_ours = torch.autograd.grad(loss, params)

    L, G = out.completion.shape[1], ro.group_size
    adv = ref_advantages(ro.rewards, G)
    torch.testing.assert_close(ro.advantages, adv)
    model = lambda net: (lambda x: logits_fn(net)(x, None))  # noqa: E731 - the public forward: no mask
    losses = []
    for s in range(0, ro.completion_ids.shape[0], G):
        traj = [x[s:s + G] for x in public.traj]
        unmask = [u[s:s + G] for u in public.unmask]
        assert all(u.any() for u in unmask)  # no 0 / 0 in the public code
        with torch.no_grad():
            old = ref_get_per_token_logps(model(old_net), traj, unmask, L)
            ref = ref_get_per_token_logps(model(ref_net), traj, unmask, L)
        new = ref_get_per_token_logps(model(new_net), traj, unmask, L)
        losses.append(ref_compute_loss(new, old, ref, unmask, adv[s:s + G])[0])
    public_loss = torch.stack(losses).mean()
    g_ref = torch.autograd.grad(public_loss, params)
    assert loss.item() == pytest.approx(public_loss.item(), abs=1e-6, rel=1e-6)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    rows = (counts > 0).sum().item()  # one forward row per (sample, transition) that unmasked a token
    assert metrics["cost/train_forwards_per_sample"].item() == pytest.approx(rows / counts.shape[0])


def test_the_rows_are_the_recorded_transitions_and_post_eos_tokens_train(tiny_bundle):
    """Each transition's mask is what the public recording unmasked at that step, tokens after the first
    EOS included; ``after_eos=false`` drops those."""
    bundle = tiny_bundle
    ro, public, out = early_eos_rollout(bundle, pin=True)
    eos_rows = ro.completion_mask == 0  # (n, L) strictly after the first EOS
    ctx = StepContext(ro, 0, 0, None, None, None)
    mask = objective_of(bundle).plan(ctx).mask.bool()  # (n, T, L)
    assert torch.equal(mask, torch.stack(public.unmask, 1))
    assert (mask.any(1) & eos_rows).any()  # post-EOS tokens are trained
    assert not (mask.any(1) & ro.pinned).any()  # pinned tokens are in no transition
    cut = objective_of(bundle, after_eos=False).plan(StepContext(ro, 0, 0, None, None, None)).mask.bool()
    assert torch.equal(cut, mask & ~eos_rows[:, None, :])


def test_recorded_old_values_equal_the_recomputed_ones_at_theta_old(tiny_bundle):
    ro, _, _ = masked_rollout(tiny_bundle, "eoser-ass")
    fwd = logits_fn(tiny_bundle.net.eval())
    ctx = StepContext(ro, 1, 0, fwd, fwd, None)
    recompute = objective_of(tiny_bundle).logp_units(ctx, fwd, "old")
    recorded = objective_of(tiny_bundle, old_logp="recorded").logp_units(StepContext(ro, 1, 0, fwd, fwd, None), fwd, "old")
    assert torch.equal(recompute.mask, recorded.mask) and recorded.mask.sum() > 0
    torch.testing.assert_close(recompute.logp * recompute.mask, recorded.logp, atol=2e-5, rtol=0)


def test_block_model_scores_each_transition_as_the_sampler_saw_it():
    """A block model (two 4-token blocks of completion, 2 steps each): at theta_old every unmasked
    token's score is the sampler's own log-prob of it."""
    torch.manual_seed(0)
    bundle = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=4))
    ids, pmask = encode_prompts(bundle.tokenizer, [p for p in ["1203=12=", "4021=33="] for _ in range(4)],
                                pad_to_multiple_of=4)
    rec = TrajectoryRecorder(bundle.mask_token_id, record_greedy=False)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=1.0)
    out = block_generate(bundle.net.eval(), ids, pmask, cfg, 4, bundle.mask_token_id, RowNoise.rows(3, 0, 8), rec)
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1])
    adv, _ = GroupAdvantage(GroupConfig())(rewards, 4)
    ro = rollout_of(ids, pmask, out.completion, completion_mask(out.completion, bundle.eos_token_id), rewards, adv, 4,
                    trajectory=rec, sampler_logp=out.token_logp)
    obj = objective_of(bundle)
    fwd = logits_fn(bundle.net.eval())
    ctx = StepContext(ro, 1, 0, fwd, fwd, None)
    s = obj.logp_units(ctx, fwd, "old")
    assert s.mask.sum() > 0
    torch.testing.assert_close(s.logp * s.mask, obj.sampler_units(ctx), atol=2e-5, rtol=0)
    loss, _ = obj.loss(StepContext(ro, 1, 0, logits_fn(perturbed(bundle.net)), fwd, None))
    assert torch.isfinite(loss) and loss.requires_grad


def test_old_and_reference_policies_are_scored_once_per_rollout(tiny_bundle):
    ro, _, _ = masked_rollout(tiny_bundle)
    calls = {"old": 0, "ref": 0}

    def counting(net, role):
        fwd = logits_fn(net)

        def f(ids, attn=None):
            calls[role] += 1
            return fwd(ids, attn)
        return f

    obj = objective_of(tiny_bundle, mu=3)
    ctx = StepContext(ro, 0, 0, logits_fn(perturbed(tiny_bundle.net)), counting(tiny_bundle.net.eval(), "old"),
                      counting(perturbed(tiny_bundle.net, 9), "ref"), policy_is_old=True)
    for it in range(3):
        ctx.inner_iter = it
        obj.loss(ctx)
        ctx.policy_is_old = False
    assert calls == {"old": 1, "ref": 1}  # iteration 0 takes the policy's own values; 1 and 2 share one forward


# ======================================================================= 3. invariants
def test_ratio_one_clips_nothing_and_weighs_transitions_equally_hand_computed():
    # one group of two samples, two transitions: transition 0 unmasks 1 + 2 tokens, transition 1 one token
    logp = torch.tensor([[[-1.0, 0, 0], [0, -2.0, 0]], [[-0.5, -0.3, 0], [0, 0, 0]]], requires_grad=True)
    mask = torch.tensor([[[1.0, 0, 0], [0, 1, 0]], [[1, 1, 0], [0, 0, 0]]])
    adv = torch.tensor([2.0, -1.0])[:, None, None]
    loss, m = cj_grpo_loss(logp, logp.detach().clone(), adv, mask, CJGRPOConfig(), group_size=2)
    expect = -(((2.0 - 1.0 - 1.0) / 3) + 2.0) / 2  # transition 0: token mean of A over 3 tokens; 1: A = 2
    assert loss.item() == pytest.approx(expect)
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    (g,) = torch.autograd.grad(loss, logp)
    w = torch.tensor([[[1 / 3, 0, 0], [0, 1, 0]], [[1 / 3, 1 / 3, 0], [0, 0, 0]]]) / 2
    torch.testing.assert_close(g, -adv * w)
    sample, _ = cj_grpo_loss(logp, logp.detach().clone(), adv, mask, CJGRPOConfig(agg="sample"), group_size=2)
    assert sample.item() == pytest.approx(-((2.0 + 2.0) / 2 + (-1.0)) / 2)  # per sample, then the mean


def test_zero_advantages_give_zero_gradient_and_clipping_stops_it():
    new, old, ref, mask, _ = random_case(seed=7, scale=0.5)
    lp = new.clone().requires_grad_(True)
    loss, _ = cj_grpo_loss(lp, old, torch.zeros(12, 1, 1), mask.float(), CJGRPOConfig(), group_size=4)
    assert torch.autograd.grad(loss, lp)[0].abs().max() == 0
    logp = torch.log(torch.tensor([[[1.6, 0.4]]])).requires_grad_(True)  # ratios 1.6 (> 1.5) and 0.4 (< 0.5)
    for a, clipped_at in ((1.0, 0), (-1.0, 1)):  # A > 0: above 1 + eps clipped; A < 0: below 1 - eps clipped
        loss, m = cj_grpo_loss(logp, torch.zeros(1, 1, 2), torch.tensor([[[a]]]), torch.ones(1, 1, 2), CJGRPOConfig(),
                               group_size=1)
        (g,) = torch.autograd.grad(loss, logp)
        assert g[0, 0, clipped_at] == 0 and g[0, 0, 1 - clipped_at] != 0
        assert m["ratio/clip_frac_high" if a > 0 else "ratio/clip_frac_low"].item() == 0.5


def test_all_masked_is_finite_and_on_the_graph(tiny_bundle):
    loss, _ = cj_grpo_loss(torch.zeros(4, 3, 5, requires_grad=True), torch.full((4, 3, 5), -50.0),
                           torch.ones(4, 1, 1), torch.zeros(4, 3, 5), CJGRPOConfig(), group_size=2)
    assert loss.item() == 0 and loss.requires_grad
    with pytest.raises(ValueError, match="whole sets"):
        transition_mean(torch.zeros(3, 2, 2), torch.ones(3, 2, 2), 2)
    # nothing to train (every token left out by the reward's mask): one empty row, zero gradient
    ro, _, _ = masked_rollout(tiny_bundle)
    ro = replace(ro, loss_mask=torch.zeros_like(ro.completion_mask))
    net = tiny_bundle.net
    loss, m = objective_of(tiny_bundle).loss(StepContext(ro, 0, 0, logits_fn(net), logits_fn(net), None,
                                                         policy_is_old=True))
    assert loss.item() == 0 and m["cost/train_forwards_per_sample"].item() == 0
    loss.backward()
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in net.parameters())


# ======================================================================= 4. config
@pytest.mark.parametrize("override, key", [
    (dict(eps=0.0), "objective.eps"), (dict(eps=1.5), "objective.eps"), (dict(agg="token"), "objective.agg"),
    (dict(old_logp="cached"), "objective.old_logp"), (dict(mu=0), "objective.mu"),
])
def test_nonsense_options_fail_in_one_line(override, key):
    with pytest.raises(ConfigError) as err:
        CJGRPOConfig(**override).validate()
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_wrong_pieces_fail_at_start_up_in_one_line(tmp_path):
    from diffusion_rl.app.train import build

    for overrides, key in ((["likelihood=elbo"], "likelihood.name"), (["advantage=stepwise"], "advantage.name"),
                           (["sampler.schedule=ass", "sampler.steps=8"], "sampler.steps")):
        with pytest.raises(ConfigError) as err:
            build(compose_cfg(["objective=cj_grpo", *overrides], tmp_path))
        assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_the_yaml_runs_the_public_regime_and_the_recipe_sets_sudoku_updates(tmp_path):
    from diffusion_rl.app.train import build

    c = build(compose_cfg(["objective=cj_grpo", "task=countdown", "~testbed"], tmp_path))
    o = c.objective.cfg
    assert (o.eps, o.beta, o.agg, o.old_logp, o.after_eos) == (0.5, 0.04, "group", "recompute", True)
    assert c.advantage.cfg.name == "group" and c.optim.lr == 3e-6 and c.optim.grad_clip == 0.2
    assert o.mu == 8  # conf/recipe/cj_grpo_countdown.yaml
    c = build(compose_cfg(["objective=cj_grpo", "task=gsm8k", "~testbed"], tmp_path))
    assert c.objective.cfg.mu == 12
    c = build(compose_cfg(["objective=cj_grpo", "~testbed"], tmp_path))  # task=sudoku
    assert c.objective.cfg.mu == 8


# ======================================================================= 5. two processes (a whole run: tests/e2e/test_objective_runs.py)


def _losses_on(shard, mu=2):
    """The loss of every inner update of one rollout (3 groups of 4, the second spanning both halves),
    computed by the process ``shard`` describes from its own rows."""
    torch.manual_seed(0)
    bundle = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))
    full, _, out = masked_rollout(bundle, pin=True)
    n = full.completion_ids.shape[0]
    rows = shard.rows(n)
    local = torch.arange(n)[rows]
    ro = rollout_of(full.prompt_ids[rows], full.prompt_mask[rows], full.completion_ids[rows], full.completion_mask[rows],
                    full.rewards[rows], full.advantages[rows], 4, shard=shard, trajectory=full.trajectory.select(local),
                    sampler_logp=out.token_logp[rows], pinned=full.pinned[rows])
    ro = replace(ro, all_rewards=full.rewards)
    obj = objective_of(bundle, mu=mu)
    ctx = StepContext(ro, 0, 0, logits_fn(perturbed(bundle.net)), logits_fn(bundle.net.eval()),
                      logits_fn(perturbed(bundle.net, 9)))
    out_losses = []
    for it in range(mu):
        ctx.inner_iter = it
        loss, _ = obj.loss(ctx)
        out_losses.append(loss.item())
    return out_losses


def _ddp_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    from diffusion_rl.core.distributed import Shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(_losses_on(Shard(rank, world, rank * 12 // world)), f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_give_the_one_process_losses(tmp_path):
    """Gloo, two processes with 6 rows each: the (sample, transition, position) units gathered, a group
    spanning the processes reduced as on one."""
    import torch.multiprocessing as mp

    from diffusion_rl.core.distributed import Shard

    one = _losses_on(Shard())
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        assert torch.load(tmp_path / f"{rank}.pt") == pytest.approx(one, abs=1e-6, rel=1e-6)
