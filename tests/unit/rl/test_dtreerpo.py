"""d-TreeRPO (rl/objectives/dtreerpo.py) and tree rollouts (rl/tree.py) against a plain transcription of
the public code (THU-BPM/d-TreeRPO @ 3eb6f21, dtreerpo/dtreerpo_trainer.py: values L359-370, sibling
advantages L395-410, transition log-probs L165-214, loss L757-902), on random tensors and on the
embedded model's own tree rollouts: values and gradients, fp32, 1e-6."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.dtreerpo import (
    DTreeRPOConfig,
    dtreerpo_loss,
    schedule,
    self_distillation,
)
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.rl.tree import TreeConfig, node_values, sibling_advantages
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from tests.helpers.common import compose_cfg

TOL = dict(atol=1e-6, rtol=1e-6)


# ---- the public code, transcribed as plainly as possible -------------------------------
def ref_tree_values(children: dict[int, list[int]], leaf_reward: dict[int, float], root: int) -> dict[int, float]:
    """Bottom-up: a leaf's reward, else the mean of the children's values (L359-370)."""
    out: dict[int, float] = {}

    def visit(n: int) -> float:
        if n in leaf_reward:
            out[n] = leaf_reward[n]
        else:
            out[n] = sum(visit(c) for c in children[n]) / len(children[n])
        return out[n]

    visit(root)
    return out


def ref_local_advantages(children: dict[int, list[int]], values: dict[int, float]) -> dict[int, float]:
    """A node's value minus the mean of its siblings' (the other children of its parent; L395-410)."""
    adv = {}
    for kids in children.values():
        for k in kids:
            sib = [values[j] for j in kids if j != k]
            adv[k] = values[k] - (sum(sib) / len(sib) if sib else 0.0)
    return adv


def ref_transition_logps(logits, parent_ids, child_ids, prompt_len, mask_id, eos_id):
    """_get_local_transition_logps + _build_completion_mask: the child's newly decoded tokens up to its
    first EOS, scored on the parent's logits (B, T, V)."""
    comp_logits = logits[:, prompt_len:]
    child, parent = child_ids[:, prompt_len:], parent_ids[:, prompt_len:]
    changed = (parent == mask_id) & (child != mask_id)
    unmasked = (child != mask_id).float()
    is_eos = child == eos_id
    B, L = child.shape
    eos_idx = torch.full((B,), L, dtype=torch.long)
    has = is_eos.any(1)
    eos_idx[has] = is_eos[has].int().argmax(1)
    eos_mask = (torch.arange(L)[None, :] <= eos_idx[:, None]).float() * unmasked
    active = (changed & (eos_mask > 0)).float()
    per_tok = -F.cross_entropy(comp_logits.reshape(-1, comp_logits.shape[-1]), child.reshape(-1),
                               reduction="none").view(B, L)
    return torch.nan_to_num(per_tok * active, nan=0.0, posinf=0.0, neginf=0.0), eos_mask


def ref_loss(new_logps, old_logps, ref_logps, comp_mask, adv, eps, beta, group_ids, child_tokens, parent_logits,
             step, T, lambda_max=3e-3, gamma=2.0, tau_max=2.0, beta_tau=0.7):
    """compute_loss (L757-902). parent_logits: the completion logits (B, L, V) of every row's parent
    state; the public code takes the first row of each group (its extra forward)."""
    changed = (new_logps != 0).float()
    active = comp_mask * changed
    L_eff = active.sum(1).clamp_min(1)
    ratio = torch.exp(new_logps - old_logps)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    A = adv[:, None]
    obj = torch.min(ratio * A, clipped * A) * active
    total = (-(obj.sum(1) / L_eff)).mean()
    if beta:
        delta = ref_logps - new_logps
        kl = torch.exp(delta) - delta - 1.0
        total = total + beta * ((kl * active).sum(1) / L_eff).mean()
    progress = min(1.0, max(0.0, step / T))
    lam = lambda_max * (math.exp(gamma * progress) - 1.0) / (math.exp(gamma) - 1.0)
    tau = max(tau_max * max(0.0, 1.0 - progress) ** beta_tau, 1e-6)
    uniq = torch.unique(group_ids)
    first_row = {int(g): int((group_ids == g).nonzero()[0, 0]) for g in uniq}
    logp_parent = F.log_softmax(parent_logits, -1)
    s, count = torch.tensor(0.0), 0
    for g in uniq.tolist():
        idxs = (group_ids == g).nonzero().squeeze(-1)
        if idxs.numel() <= 1:
            continue
        a_full = adv[idxs]
        pos = a_full > 0
        if pos.sum() == 0:
            continue
        w = F.softmax(a_full[pos] / tau, 0)
        rows = idxs[pos]
        act, toks = active[rows] > 0, child_tokens[rows]
        for j in range(child_tokens.shape[1]):
            ak = act[:, j]
            if not ak.any():
                continue
            u, inv = torch.unique(toks[ak, j], return_inverse=True)
            qw = torch.zeros_like(u, dtype=torch.float32).index_add_(0, inv, w[ak].float())
            if qw.sum() <= 0:
                continue
            q = qw / (qw.sum() + 1e-8)
            lp = logp_parent[first_row[g], j].gather(0, u)
            s = s + torch.sum(q * (torch.log(q + 1e-8) - lp))
            count += 1
    sd = s / count if count else torch.tensor(0.0)
    return total + lam * sd


def random_case(seed=0, groups=3, K=4, L=6, V=5):
    g = torch.Generator().manual_seed(seed)
    rows = groups * K
    group_ids = torch.arange(groups).repeat_interleave(K)
    parent_logits = torch.randn(groups, L, V, generator=g)
    tokens = torch.randint(0, V, (rows, L), generator=g)
    tokens[:, 0] = 0  # shared tokens: the mix q has mass > 1 / K somewhere
    mask = (torch.rand(rows, L, generator=g) < 0.7).float()
    values = torch.rand(rows, generator=g)
    adv = values - (values.view(groups, K).sum(1).repeat_interleave(K) - values) / (K - 1)
    old = (F.log_softmax(parent_logits, -1)[group_ids].gather(-1, tokens[..., None])[..., 0]
           + 0.3 * torch.randn(rows, L, generator=g)) * mask
    ref = old + 0.2 * torch.randn(rows, L, generator=g) * mask
    return group_ids, parent_logits, tokens, mask, adv, old, ref


def ours(parent_logits, group_ids, tokens, mask, adv, old, ref, cfg, step):
    logp = F.log_softmax(parent_logits, -1)[group_ids].gather(-1, tokens[..., None])[..., 0] * mask  # (K, L)
    loss, _ = dtreerpo_loss(logp, old, adv[:, None], mask, cfg, group_size=0)
    units = torch.exp(ref - logp) - (ref - logp) - 1
    kl = ((units * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    lam, tau = schedule(cfg, step)
    sd, _ = self_distillation(logp, tokens, mask, adv, group_ids, tau)
    return loss + cfg.beta * kl + lam * sd


@pytest.mark.parametrize("step", [0, 9000, 30000])
def test_loss_and_gradient_equal_the_public_loss_on_random_tensors(step):
    cfg = DTreeRPOConfig()
    group_ids, pl, tokens, mask, adv, old, ref = random_case()
    a = pl.clone().requires_grad_(True)
    b = pl.clone().requires_grad_(True)
    mine = ours(a, group_ids, tokens, mask, adv, old, ref, cfg, step)
    new_public = F.log_softmax(b, -1)[group_ids].gather(-1, tokens[..., None])[..., 0] * mask
    theirs = ref_loss(new_public, old, ref, mask, adv, cfg.eps, cfg.beta, group_ids, tokens, b[group_ids], step,
                      cfg.distill_steps)
    mine.backward()
    theirs.backward()
    assert torch.allclose(mine, theirs, **TOL)
    assert torch.allclose(a.grad, b.grad, **TOL)
    assert a.grad.abs().sum() > 0


def test_the_parity_check_fails_on_a_one_line_change_of_the_loss():
    """The comparison above can fail: the PPO term with max in place of min differs."""
    cfg = DTreeRPOConfig()
    group_ids, pl, tokens, mask, adv, old, ref = random_case(seed=1)
    logp = F.log_softmax(pl, -1)[group_ids].gather(-1, tokens[..., None])[..., 0] * mask
    loss, _ = dtreerpo_loss(logp, old, adv[:, None], mask, cfg, group_size=0)
    ratio = torch.exp(logp - old)
    mutant = torch.max(ratio * adv[:, None], ratio.clamp(1 - cfg.eps, 1 + cfg.eps) * adv[:, None]) * mask
    mutant = (-(mutant.sum(1) / mask.sum(1).clamp_min(1))).mean()
    assert not torch.allclose(loss, mutant, **TOL)


def test_self_distillation_hand_computed():
    """Two children with A = +1 and -1 (one positive): q is the positive child's token, KL = -log p."""
    logp = torch.tensor([[-0.5, -1.0], [-2.0, -3.0]])
    tokens = torch.tensor([[3, 4], [5, 6]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    sd, count = self_distillation(logp, tokens, mask, adv, torch.tensor([0, 0]), tau=2.0)
    assert int(count) == 1  # position 1 holds no positive child's token
    assert torch.allclose(sd, torch.tensor(math.log(1 + 1e-8) + 0.5 * (1 / (1 + 1e-8))), atol=1e-6)


def test_schedule_grows_lambda_and_shrinks_tau():
    cfg = DTreeRPOConfig()
    assert schedule(cfg, 0) == (0.0, 2.0)
    lam, tau = schedule(cfg, 30000)
    assert lam == pytest.approx(3e-3) and tau == pytest.approx(1e-6)
    assert schedule(cfg, 15000)[0] == pytest.approx(3e-3 * (math.e - 1) / (math.e ** 2 - 1))


# ---- the tree ------------------------------------------------------------------------------
def test_values_and_advantages_equal_the_public_tree():
    # roots 0, 1; children 2..5 (two each); leaves 6..13 (two each)
    parent = torch.tensor([-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    leaf = torch.arange(6, 14)
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.0, 0.25])
    values = node_values(parent, leaf, rewards)
    adv = sibling_advantages(parent, values)
    children = {p: [k for k in range(14) if int(parent[k]) == p] for p in range(6)}
    for root in (0, 1):
        want = ref_tree_values(children, {int(n): float(r) for n, r in zip(leaf, rewards)}, root)
        want_adv = ref_local_advantages({p: c for p, c in children.items() if p in want}, want)
        for n, v in want.items():
            assert values[n].item() == pytest.approx(v)
        for n, a in want_adv.items():
            assert adv[n].item() == pytest.approx(a)
    assert adv[:2].abs().sum() == 0  # roots have no siblings


def test_default_branch_points_are_the_public_ones():
    assert TreeConfig(branches=[4, 4]).steps_remaining(128) == [128, 64]  # contraction factor 2
    assert TreeConfig(branches=[2, 2, 2, 2]).steps_remaining(128) == [128, 96, 64, 32]  # factor 4


def test_a_stopped_and_continued_sampler_equals_the_uninterrupted_one():
    torch.manual_seed(0)
    V, mask_id = 11, 10
    W = torch.randn(V, V)

    def forward(ids, attn):
        return torch.tanh(F.one_hot(ids, V).float().cumsum(1) @ W)  # depends on the whole state

    prompt = torch.randint(0, 9, (3, 4))
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.9)
    full = generate(forward, prompt, None, cfg, mask_id, RowNoise([1, 2, 3])).completion
    for cut in (1, 2, 3):  # inside the first block, at its end, inside the second
        noise = RowNoise([1, 2, 3])
        part = generate(forward, prompt, None, cfg, mask_id, noise, stop_step=cut).completion
        assert (part == mask_id).any()
        rest = generate(forward, prompt, None, cfg, mask_id, noise, canvas=part, start_step=cut).completion
        assert torch.equal(rest, full)


@pytest.fixture(scope="module")
def tree_rollout(tmp_path_factory):
    cfg = compose_cfg(["objective=dtreerpo", "rollout.tree.branches=[2,2]", "objective.beta=0.01"],
                      tmp_path_factory.mktemp("dt"))
    c = build(cfg)
    torch.manual_seed(0)
    for p in c.bundle.net.parameters():  # a policy that is not the warm start: nonzero KL and ratios
        p.data.add_(0.02 * torch.randn_like(p))
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.run.rollout, seed=3)
    ro = eng(c.task.train_items()[:3], c.bundle.net, 0)
    return c, ro


def test_tree_invariants_on_real_rollouts(tree_rollout):
    c, ro = tree_rollout
    t, mask_id = ro.tree, c.bundle.mask_token_id
    assert ro.group_size == 4 and ro.completion_ids.shape[0] == 12
    assert torch.equal(t.states[t.leaf], ro.completion_ids) and not (ro.completion_ids == mask_id).any()
    for k in t.edges.tolist():  # a child keeps every token its parent had decoded
        par = t.states[t.parent[k]]
        assert torch.equal(t.states[k][par != mask_id], par[par != mask_id])
        assert int((t.states[k] == mask_id).sum()) < int((par == mask_id).sum()) or t.depth[k] == 0
    for p in range(t.states.shape[0]):
        kids = (t.parent == p).nonzero()[:, 0]
        if kids.numel():
            assert t.values[p].item() == pytest.approx(t.values[kids].mean().item(), abs=1e-6)
            assert t.advantages[kids].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(t.values[t.leaf], ro.rewards.float())
    depth1 = (t.depth == 1).nonzero()[:, 0]  # half the schedule: the pinned givens and half the rest decoded
    assert ((t.states[depth1] == mask_id).sum(-1) > 0).all()


def test_objective_equals_the_public_loss_on_real_rollouts(tree_rollout):
    c, ro = tree_rollout
    obj, net, mask_id, eos = c.objective, c.bundle.net, c.bundle.mask_token_id, c.bundle.eos_token_id
    ref_net = copy.deepcopy(net).requires_grad_(False)
    with torch.no_grad():
        for p in ref_net.parameters():
            p.add_(0.01)
    old = logits_fn(net)
    ctx = StepContext(ro, 0, 0, logits_fn(net), old, logits_fn(ref_net), policy_is_old=False, step=12000)
    with torch.no_grad():
        ctx.precomputed_old_logp[0] = obj.compute_old_logp(ctx)  # the old policy = the policy now: ratio 1 ...
    ctx.precomputed_old_logp[0] = ctx.precomputed_old_logp[0] + 0.3 * torch.rand_like(ctx.precomputed_old_logp[0]) * (ctx.precomputed_old_logp[0] != 0)
    net.zero_grad()
    loss, metrics = obj.loss(ctx)
    loss.backward()
    mine = [p.grad.clone() for p in net.parameters()]
    assert metrics["dtreerpo/distill_pairs"] > 0
    # the public code on the same rows: full sequences, one forward per parent state
    t = ro.tree
    k = t.edges
    P = ro.prompt_ids.shape[1]
    parent_ids = torch.cat([ro.prompt_ids[t.row[k]], t.states[t.parent[k]]], 1)
    child_ids = torch.cat([ro.prompt_ids[t.row[k]], t.states[k]], 1)
    assert ro.prompt_mask.all()  # the public code passes no attention mask
    net.zero_grad()
    logits = logits_fn(net)(parent_ids, None)
    new, comp_mask = ref_transition_logps(logits, parent_ids, child_ids, P, mask_id, eos)
    with torch.no_grad():
        refl, _ = ref_transition_logps(logits_fn(ref_net)(parent_ids, None), parent_ids, child_ids, P, mask_id, eos)
    theirs = ref_loss(new, ctx.precomputed_old_logp[0], refl, comp_mask, t.advantages[k].float(), obj.cfg.eps, obj.cfg.beta,
                      t.parent[k], t.states[k], logits[:, P:], ctx.step, obj.cfg.distill_steps)
    theirs.backward()
    assert torch.allclose(loss, theirs, **TOL)
    for a, b in zip(mine, (p.grad for p in net.parameters())):
        assert torch.allclose(a, b, **TOL)


def test_grpo_trains_on_tree_leaves(tmp_path):
    cfg = compose_cfg(["objective=grpo", "rollout.tree.branches=[2,2]"], tmp_path)
    c = build(cfg)
    eng = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.run.rollout, seed=1)
    ro = eng(c.task.train_items()[:2], c.bundle.net, 0)
    # the group over leaves (per sample, or per cell with the testbed's per-cell credit on Sudoku)
    assert ro.group_size == 4 and ro.advantages.view(2, 4, -1).sum(1).abs().max() < 1e-5
    pol = logits_fn(c.bundle.net)
    loss, _ = c.objective.loss(StepContext(ro, 0, 0, pol, pol, pol, policy_is_old=True))
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("overrides, key", [
    (["objective=dtreerpo", "rollout.tree.branches=[]"], "rollout.tree.branches"),
    (["objective=dtreerpo", "sampler.decode=threshold"], "sampler.decode"),
    (["objective=dtreerpo", "rollout.tree.branch_steps=[4,4]"], "rollout.tree.branch_steps"),
    (["objective=dtreerpo", "rollout.oversample=2"], "rollout.oversample"),
    (["objective=tracerl", "rollout.tree.branches=[2,2]"], "rollout.tree.branches"),
])
def test_bad_tree_settings_stop_in_one_line(overrides, key, tmp_path):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(compose_cfg(overrides, tmp_path))


def test_yaml_holds_only_the_tree(tmp_path):
    cfg = compose_cfg(["objective=dtreerpo"], tmp_path)
    assert list(cfg.rollout.tree.branches) == [4, 4] and cfg.objective.eps == DTreeRPOConfig().eps
    assert Path(__file__).resolve().parents[3].joinpath("conf/objective/dtreerpo.yaml").exists()
