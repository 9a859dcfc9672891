"""Coupled-GRPO and its complementary-mask estimator: parity with a transcription of DiffuCoder's loss
(apple/ml-diffucoder @ f735e01, ``src/open_r1/coupled_grpo.py``) on random tensors and on a tiny model's
rollouts, hand-checked invariants, configs."""

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.complementary import (
    ComplementaryConfig,
    ComplementaryEstimator,
    coupled_token_logps,
)
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import Scores, StepContext
from diffusion_rl.rl.objectives.coupled_grpo import (
    CoupledGRPO,
    CoupledGRPOConfig,
    coupled_grpo_loss,
)
from diffusion_rl.rl.rollout import RolloutEngine
from tests.helpers.common import compose_cfg, rollout_of

V, MASK = 12, 11  # the random-tensor model's vocabulary; tokens 0..10, mask 11


class ContextModel(torch.nn.Module):
    """A random bidirectional "model" for the random-tensor parity: the logits at a position depend on
    its token, its position and the mean of every token's embedding, so masking any token changes them."""

    def __init__(self, T: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.tok = torch.nn.Parameter(torch.randn(V, V, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(T, V, generator=g))
        self.ctx = torch.nn.Parameter(torch.randn(V, V, generator=g))

    def forward(self, ids, attn=None, position_ids=None):  # the project's forward signature
        return self.tok[ids] + self.pos[: ids.shape[1]] + self.ctx[ids].mean(1, keepdim=True)  # (B, T, V)


def random_batch(B=6, P=4, L=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, MASK, (B, P), generator=g)
    comp = torch.randint(0, MASK, (B, L), generator=g)
    cmask = torch.ones(B, L)
    cmask[1, 3:] = 0  # a row that ended early
    cmask[B - 2, 5:] = 0
    return prompt, torch.ones(B, P, dtype=torch.long), comp, cmask


# ---------------------------------------------------------------- the transcription (reference)
# DiffuCoder's computation written out afresh: forward_process with its random draws passed in
# (mask_ratio, random_matrix), selective_log_softmax for one iteration, compute_loss. Shapes as there.


def ref_forward_process(batch, prompt_index, mask_id, mask_ratio, random_matrix):
    b = batch.shape[0]
    noisy_batch = []
    t_p = torch.ones(b) * mask_ratio
    is_mask = ~prompt_index
    noisy_batch.append(torch.where(is_mask, mask_id, batch))
    is_mask = ~prompt_index & (random_matrix < t_p.unsqueeze(1))
    completion_mask = is_mask
    noisy_batch.append(torch.where(is_mask, mask_id, batch))
    is_mask = ~prompt_index & (random_matrix > t_p.unsqueeze(1))
    noisy_batch.append(torch.where(is_mask, mask_id, batch))
    return noisy_batch, [1, 1 / mask_ratio, 1 / (1 - mask_ratio)], completion_mask


def ref_selective_log_softmax(logits, index, weights, mask):
    full_batch_size = logits.size(0) // 3
    num_iterations = weights.size(0) // 3
    batch_size = full_batch_size // num_iterations
    out = []
    for i in range(full_batch_size):
        seq_labels = index[i]
        chunk, offset = divmod(i, batch_size)
        base = chunk * 3 * batch_size
        rows = torch.tensor([base + offset, base + batch_size + offset, base + 2 * batch_size + offset])
        seq_logps = F.log_softmax(logits[rows], dim=-1)
        per_tok = seq_logps.gather(dim=-1, index=seq_labels.unsqueeze(0).unsqueeze(-1).expand(3, -1, 1)).squeeze(-1)
        w = weights[(i // batch_size) * 3:(i // batch_size + 1) * 3]
        weighted = torch.where(mask[i], per_tok[1] * w[1], per_tok[2] * w[2])
        out.append((per_tok[0] + weighted) / 2)
    return torch.stack(out)


def ref_per_token_logps(model, input_ids, logits_to_keep, mask_ratio, random_matrix, mask_id):
    """``_get_per_token_logps`` for one iteration: (B, T) -> (B, L)."""
    seq_len = input_ids.shape[1]
    prompt_index = torch.zeros(seq_len, dtype=torch.bool)
    prompt_index[: seq_len - logits_to_keep] = True
    noisy, weights, completion_mask = ref_forward_process(input_ids, prompt_index, mask_id, mask_ratio, random_matrix)
    logits = model(torch.cat(noisy, dim=0))
    completion_logits = logits[:, -logits_to_keep:, :]
    targets = input_ids[:, -logits_to_keep:]
    loss_mask = completion_mask[:, -logits_to_keep:]
    return ref_selective_log_softmax(completion_logits, targets, torch.tensor(weights), loss_mask)


def ref_compute_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask,
                     beta, epsilon_low, epsilon_high):
    per_token_logps = per_token_logps.unsqueeze(1)  # (B, 1, L): the iteration axis of the public code
    old = old_per_token_logps.unsqueeze(1)
    ref = ref_per_token_logps.unsqueeze(1)
    per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
    coef_1 = torch.exp(per_token_logps - old)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages.view(-1, 1, 1)
    per_token_loss2 = coef_2 * advantages.view(-1, 1, 1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss[:, 0, :] * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


def drawn_inputs(est, seeds, prompt_mask, L):
    """Our draw, handed to the transcription: its mask_ratio (one per batch) and random_matrix."""
    d = est.draw(seeds, prompt_mask, L)
    assert bool((d.t == d.t[0]).all())  # t_per=batch: one t for the whole batch, as the public code
    rm = torch.cat([torch.full_like(prompt_mask, 0.5, dtype=torch.float), d.u], 1)  # the prompt part is unused
    return float(d.t[0]), rm


# ---------------------------------------------------------------- parity


def test_estimator_matches_the_transcription_on_a_random_model():
    prompt, pmask, comp, cmask = random_batch()
    model = ContextModel(prompt.shape[1] + comp.shape[1])
    est = ComplementaryEstimator(ComplementaryConfig(), MASK)
    seeds = mask_seeds(5, 3, comp.shape[0], 1)
    ours = est(model, prompt, pmask, comp, cmask, seeds)
    t, rm = drawn_inputs(est, seeds, pmask, comp.shape[1])
    ref = ref_per_token_logps(lambda ids: model(ids), torch.cat([prompt, comp], 1), comp.shape[1], t, rm, MASK)
    assert torch.allclose(ours, ref, atol=1e-6, rtol=1e-6)  # float32 rounding of values up to ~15 nats
    g_ours = torch.autograd.grad(ours.sum(), list(model.parameters()))
    g_ref = torch.autograd.grad(ref.sum(), list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_ours, g_ref))


def test_loss_matches_the_transcription_on_random_tensors():
    g = torch.Generator().manual_seed(1)
    B, L = 6, 9
    logp = (torch.randn(B, L, generator=g) - 2).requires_grad_(True)
    old = logp.detach() + 0.6 * torch.randn(B, L, generator=g)  # ratios well outside [0.5, 1.5] too
    ref = logp.detach() + 0.3 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, L, generator=g) > 0.2).float()
    cfg = CoupledGRPOConfig()
    obj = CoupledGRPO(cfg, ComplementaryEstimator(ComplementaryConfig(), MASK))
    pg, m = coupled_grpo_loss(logp, old, adv[:, None], mask, cfg, group_size=3)
    kl = obj.kl_term(Scores(logp, mask, kl_logp=logp, kl_mask=mask), Scores(ref, mask), lambda x: x, 3)
    ours = pg + cfg.beta * kl
    expected = ref_compute_loss(logp, old, ref, adv, mask, cfg.beta, cfg.eps, cfg.eps_high)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    assert m["ratio/clip_frac_low"] + m["ratio/clip_frac_high"] > 0  # the clip was exercised
    (ga,) = torch.autograd.grad(ours, logp)
    (gb,) = torch.autograd.grad(expected, logp)
    assert torch.allclose(ga, gb, atol=1e-7)


def perturbed(net, scale, seed):
    out = copy.deepcopy(net).requires_grad_(False).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A tiny model's rollout under coupled_grpo's config, with old and reference policies apart."""
    c = build(compose_cfg(["objective=coupled_grpo", "task.pin_givens=false"], tmp_path_factory.mktemp("cgrpo")))
    # the public code knows no pinned tokens: the completion is all decisions, as there
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = eng(c.task.splits.train[:2], c.bundle.net, 0)
    cmask = ro.completion_mask.clone()
    cmask[0, 5:] = 0  # rows of different lengths, as if they had ended early: token-mean != sequence mean
    cmask[2, 9:] = 0
    ro = replace(ro, advantages=torch.linspace(-1.5, 1.5, ro.advantages.shape[0]), completion_mask=cmask)
    return c, ro


def test_objective_matches_the_transcription_on_a_tiny_models_rollout(real):
    c, ro = real
    net = c.bundle.net.train()
    old, ref = perturbed(net, 0.05, 1), perturbed(net, 0.03, 2)
    obj = c.objective
    assert isinstance(obj, CoupledGRPO) and c.advantage.cfg.name == "loo"
    for it in range(obj.cfg.mu):
        ctx = StepContext(ro, it, 3, logits_fn(net), logits_fn(old), logits_fn(ref))
        ours, m = obj.loss(ctx)
        g_ours = torch.autograd.grad(ours, list(net.parameters()))
        # the transcription, fed our masks (one t per batch) and the same forwards
        ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
        attn = torch.cat([ro.prompt_mask, torch.ones_like(ro.completion_ids)], 1)
        L = ro.completion_ids.shape[1]
        t, rm = drawn_inputs(obj.likelihood, obj.mask_seeds(ctx, "policy"), ro.prompt_mask, L)

        def lp(f, ids=ids, attn=attn, t=t, rm=rm, L=L):
            return ref_per_token_logps(lambda x: f(x, attn.repeat(3, 1)), ids, L, t, rm, c.bundle.mask_token_id)

        with torch.no_grad():
            old_lp, ref_lp = lp(logits_fn(old)), lp(logits_fn(ref))
        expected = ref_compute_loss(lp(logits_fn(net)), old_lp, ref_lp, ro.advantages, ro.completion_mask.float(),
                                    obj.cfg.beta, obj.cfg.eps, obj.cfg.eps_high)
        g_ref = torch.autograd.grad(expected, list(net.parameters()))
        assert ours.item() == pytest.approx(expected.item(), abs=1e-6), it
        assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_ours, g_ref)), it
        assert m["train/kl"].item() > 0 and m["ratio/log_std"].item() > 0


# ---------------------------------------------------------------- the estimator


def test_coupled_token_logps_hand_computed():
    full = torch.tensor([[-1.0, -2.0, -3.0]])
    half_lp = torch.tensor([[-0.5, 0.0, -1.5]])  # read where half
    comp_lp = torch.tensor([[0.0, -4.0, 0.0]])  # read elsewhere
    half = torch.tensor([[True, False, True]])
    t = torch.tensor([0.25])
    out = coupled_token_logps(full, half_lp, comp_lp, half, t)
    expected = torch.tensor([[(-1 - 0.5 / 0.25) / 2, (-2 - 4 / 0.75) / 2, (-3 - 1.5 / 0.25) / 2]])
    assert torch.allclose(out, expected)


def forward_spy(model):
    seen = []

    def fwd(ids, attn, position_ids=None):
        seen.append(ids.clone())
        return model(ids, attn)

    return fwd, seen


@pytest.mark.parametrize("t_per", ["batch", "sample"])
def test_every_token_is_scored_exactly_once_per_pair(t_per):
    prompt, pmask, comp, cmask = random_batch(B=8, L=16)
    fwd, seen = forward_spy(ContextModel(20))
    est = ComplementaryEstimator(ComplementaryConfig(t_per=t_per), MASK)
    for it in range(3):
        seen.clear()
        est(fwd, prompt, pmask, comp, cmask, mask_seeds(0, 1, 8, it))
        assert len(seen) == 1  # one forward over the three copies
        full, half, compl = (seen[0].view(3, 8, -1)[:, :, 4:] == MASK).unbind(0)
        assert bool(full.all())
        assert bool((half ^ compl).all())  # each token masked in exactly one of the pair
        assert bool(half.any()) and bool(compl.any())
        assert torch.equal(seen[0].view(3, 8, -1)[:, :, :4], prompt.expand(3, -1, -1))  # the prompt stays clean


def test_one_t_per_batch_shared_by_old_and_new_and_fresh_with_the_iteration():
    pmask = torch.ones(8, 3, dtype=torch.long)
    est = ComplementaryEstimator(ComplementaryConfig(), MASK)
    d0 = est.draw(mask_seeds(0, 1, 8, 0), pmask, 10)
    assert bool((d0.t == d0.t[0]).all()) and 0.2 <= float(d0.t[0]) <= 0.8
    again = est.draw(mask_seeds(0, 1, 8, 0), pmask, 10)
    assert torch.equal(again.t, d0.t) and torch.equal(again.u, d0.u)  # the same seeds: the same masks
    ts = {float(est.draw(mask_seeds(0, r, 8, it), pmask, 10).t[0]) for r in range(3) for it in range(3)}
    assert len(ts) == 9 and min(ts) >= 0.2 and max(ts) <= 0.8
    rows = est.draw(mask_seeds(0, 1, 8, 0), pmask, 10).u
    assert not torch.equal(rows[0], rows[1])  # the per-token uniforms are per row
    per_row = ComplementaryEstimator(ComplementaryConfig(t_per="sample"), MASK).draw(mask_seeds(0, 1, 8, 0), pmask, 10)
    assert len(set(per_row.t.tolist())) == 8 and torch.equal(per_row.u, d0.u)  # only t changes


def test_a_context_free_model_gives_the_weights_exactly():
    """With logits that ignore the input, every copy gives the same c_i = log p(x_i), so the estimate is
    1/2 (c_i + c_i / t) where the half copy masks i and 1/2 (c_i + c_i / (1 - t)) elsewhere."""
    prompt, pmask, comp, cmask = random_batch()
    table = torch.randn(prompt.shape[1] + comp.shape[1], V)

    def fwd(ids, attn, position_ids=None):
        return table[: ids.shape[1]].expand(ids.shape[0], -1, -1)

    est = ComplementaryEstimator(ComplementaryConfig(t_min=0.3, t_max=0.3), MASK)
    seeds = mask_seeds(1, 2, comp.shape[0], 0)
    out = est(fwd, prompt, pmask, comp, cmask, seeds)
    c = torch.log_softmax(table[prompt.shape[1]:], -1).gather(-1, comp.T).T  # (B, L)
    half = est.draw(seeds, pmask, comp.shape[1]).half
    assert torch.allclose(out, torch.where(half, (c + c / 0.3) / 2, (c + c / 0.7) / 2), atol=1e-6)


def test_prompt_masking_is_shared_by_the_three_copies():
    prompt, pmask, comp, cmask = random_batch(B=8)
    fwd, seen = forward_spy(ContextModel(11))
    est = ComplementaryEstimator(ComplementaryConfig(p_mask_prompt=0.5), MASK)
    est(fwd, prompt, pmask, comp, cmask, mask_seeds(0, 1, 8, 0))
    p = seen[0].view(3, 8, -1)[:, :, :4] == MASK
    assert bool(p.any()) and torch.equal(p[0], p[1]) and torch.equal(p[0], p[2])


# ---------------------------------------------------------------- the objective's invariants


def test_ratio_one_clips_nothing_and_zero_advantages_give_no_gradient(real):
    c, ro = real
    net = c.bundle.net.train()
    obj = CoupledGRPO(CoupledGRPOConfig(beta=0.0), c.objective.likelihood)
    f = logits_fn(net)
    loss, m = obj.loss(StepContext(ro, 1, 3, f, f, None))
    assert m["ratio/log_min"].item() == 0 and m["ratio/log_max"].item() == 0  # shared masks: exactly 1
    assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
    mask = ro.completion_mask.float()
    token_mean_adv = (ro.advantages[:, None] * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(-token_mean_adv.item(), abs=1e-6)  # every token weighs the same
    zero = replace(ro, advantages=torch.zeros_like(ro.advantages))
    loss, _ = obj.loss(StepContext(zero, 0, 3, f, logits_fn(perturbed(net, 0.05, 4)), None))
    grads = torch.autograd.grad(loss, [p for p in net.parameters() if p.requires_grad], allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)


def test_token_mean_differs_from_grpos_sequence_mean():
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([[1.0], [-1.0]])
    loss, _ = coupled_grpo_loss(logp, logp.detach(), adv, mask, CoupledGRPOConfig(), group_size=2)
    assert loss.item() == pytest.approx(-(4 * 1 - 1) / 5)  # GRPO's per-sequence mean would give 0


def test_all_masked_is_finite():
    logp = torch.randn(3, 5, requires_grad=True)
    loss, m = coupled_grpo_loss(logp, logp.detach() + 1, torch.ones(3, 1), torch.zeros(3, 5), CoupledGRPOConfig(),
                                group_size=3)
    loss.backward()
    assert loss.item() == 0 and bool(torch.isfinite(logp.grad).all())
    assert all(bool(torch.isfinite(v)) for v in m.values())


# ---------------------------------------------------------------- configs


def test_config_selects_its_estimator_and_loo_and_the_command_line_wins(tmp_path):
    cfg = compose_cfg(["objective=coupled_grpo"], tmp_path)
    assert (cfg.likelihood.name, cfg.advantage.name, cfg.objective.mu, cfg.objective.beta) == ("complementary", "loo", 2, 0.01)
    assert cfg.objective.eps == 0.5 and cfg.objective.eps_high == 0.5
    c = build(compose_cfg(["objective=coupled_grpo", "likelihood=one_step", "advantage=group"], tmp_path))
    assert c.objective.likelihood.cfg.name == "one_step" and c.advantage.cfg.name == "group"
    assert compose_cfg(["objective=grpo", "likelihood=complementary"], tmp_path).likelihood.t_min == 0.2


@pytest.mark.parametrize("overrides,key", [
    (["likelihood=elbo"], "likelihood.name"),  # a sequence-level estimator
    (["likelihood.t_min=0"], "likelihood.t_min"),
    (["likelihood.t_max=1.0"], "likelihood.t_max"),
    (["likelihood.t_min=0.6", "likelihood.t_max=0.4"], "likelihood.t_max"),
    (["likelihood.t_per=row"], "likelihood.t_per"),
    (["objective.eps=1.5"], "objective.eps"),
])
def test_nonsense_fails_in_one_line(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build(compose_cfg(["objective=coupled_grpo", *overrides], tmp_path))
    assert "\n" not in str(err.value)


def test_grpo_can_use_the_complementary_estimator(real):
    """The estimator is per token and registered: d1's GRPO runs on it unchanged."""
    from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig

    c, ro = real
    f = logits_fn(c.bundle.net)
    loss, m = GRPO(GRPOConfig(beta=0.0), c.objective.likelihood).loss(StepContext(ro, 0, 3, f, f, None))
    assert torch.isfinite(loss) and m["ratio/log_max"].item() == 0


def test_rollout_of_hand_made_tensors_runs():
    prompt, pmask, comp, cmask = random_batch(B=4)
    ro = rollout_of(prompt, pmask, comp, cmask, torch.arange(4.0), torch.tensor([1.0, -1.0, 0.5, -0.5]), 2)
    model = ContextModel(11)
    obj = CoupledGRPO(CoupledGRPOConfig(beta=0.0), ComplementaryEstimator(ComplementaryConfig(), MASK))
    loss, _ = obj.loss(StepContext(ro, 0, 0, model, perturbed(model, 0.1, 0), None))
    loss.backward()
    assert torch.isfinite(loss) and model.tok.grad.abs().sum() > 0
