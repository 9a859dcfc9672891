"""TraceRL: parity with a transcription of the public code (Gen-Verse/dLLM-RL @ 10b4fd1), on random
tensors and on the tiny models' own recorded rollouts (masked and block); the rows (the rounds are
hand-computed in tests/unit/likelihood/test_trace.py); the loss's invariants; the z-score advantages and
the group filter; the truncated-reward rollout option; the config errors.

The reference below is written for this test from the public files (``train/rl_sdar.py``:
``collapse_k_unique``, ``make_basic_block_attention``, ``one_round_vectorized``,
``collect_training_data``, ``forward_process``; ``train/rl_llada.py``: ``prepare_inputs_and_labels_for_text``,
``forward_process``; ``reward/rl_reward.py``: ``z_score_normalize`` and the pass-rate filter), in the
same tensor operations and order, and imports nothing of ``rl/objectives/tracerl.py``.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, encode_prompts, logits_fn
from diffusion_rl.rl.advantages import ZScoreAdvantage, ZScoreConfig
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.tracerl import TraceRL, TraceRLConfig, tracerl_loss
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.block import block_generate
from diffusion_rl.sampling.sampler import completion_mask
from diffusion_rl.sampling.trajectory import FILLED, TrajectoryRecorder
from tests.helpers.common import compose_cfg, rollout_of


# ======================================================================= the public code, transcribed
def ref_collapse_k_unique(lst, k):
    uniq = sorted(set(lst))
    mapping = {}
    n = len(uniq)
    for idx, val in enumerate(uniq):
        group = idx // k
        end_idx = min((group + 1) * k - 1, n - 1)
        mapping[val] = uniq[end_idx]
    return [mapping[x] for x in lst]


def ref_z_score_normalize(lst):
    mean = sum(lst) / len(lst)
    std = (sum((x - mean) ** 2 for x in lst) / len(lst)) ** 0.5
    if std == 0:
        return [0 for x in lst]
    return [(x - mean) / std for x in lst]


def ref_reward_file(correctness_groups):
    """rl_reward.py: per group the z-scores, and the groups kept (0.2 <= proportion <= 0.8)."""
    out = []
    for correctness in correctness_groups:
        rewards = ref_z_score_normalize(correctness)
        proportion = sum(correctness) / len(correctness)
        out.append((rewards, not (proportion > 0.8 or proportion < 0.2)))
    return out


def ref_llada_rows(input_ids, step_map, reward, start_pos, mask_id, shrink, tail_pad):
    """rl_llada.py's TraceRL branch; ``tail_pad`` (B, L) are the response's pad tokens post_num drops
    (here: the tokens after the first EOS)."""
    noisy_list, label_list, pmask_list, reward_list = [], [], [], []
    B, L = input_ids.shape
    for b in range(B):
        order_list = ref_collapse_k_unique(list(step_map[b]), shrink)
        order = torch.as_tensor(order_list)
        order_full = torch.full((L,), -1)
        order_full[start_pos:] = order[: L - start_pos]
        uniq_steps = torch.unique(order_full[start_pos:], sorted=True)
        base_ids = input_ids[b]
        tail_pad_b = tail_pad[b]
        for step_val in uniq_steps:
            tgt_mask = order_full == step_val
            pmask_this = tgt_mask & ~tail_pad_b
            if not pmask_this.any():
                continue
            noisy_ids = base_ids.clone()
            mask_pos = order_full >= step_val
            noisy_ids[mask_pos] = mask_id
            noisy_list.append(noisy_ids)
            label_list.append(input_ids[b])
            pmask_list.append(pmask_this)
            reward_list.append(reward[b])
    return torch.stack(noisy_list), torch.stack(label_list), torch.stack(pmask_list), reward_list


def ref_llada_loss(logp_new_tok, logp_old_tok, p_mask_lm, adv, eps, beta):
    """rl_llada.py forward_process, from the gathered token log-probs on."""
    B = logp_new_tok.shape[0]
    adv = torch.as_tensor(adv).detach()
    ratio = torch.exp(logp_new_tok - logp_old_tok)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    adv_tok = adv.unsqueeze(1)
    surrogate_tok = torch.min(ratio * adv_tok, clipped * adv_tok)
    surrogate_tok = surrogate_tok * p_mask_lm
    num_mask = torch.clamp(p_mask_lm.sum(dim=1), min=1)
    surrogate_tok = surrogate_tok.sum(dim=1) / num_mask
    policy_loss = -(surrogate_tok.sum() / B)
    kl_seq = logp_new_tok - logp_old_tok
    kl_seq = (-kl_seq).exp() - 1.0 + kl_seq
    kl_seq = (kl_seq * p_mask_lm).sum(dim=1)
    kl_loss = beta * kl_seq.sum() / B
    return policy_loss + kl_loss


def ref_one_round_vectorized(input_ids_b, step_map_b, L0, L1, block_size, mask_id):
    NB = (L1 + block_size - 1) // block_size
    step_pad = torch.full((NB * block_size,), -1, dtype=torch.long)
    step_pad[:L1] = step_map_b
    step_blk = step_pad.view(NB, block_size)
    valid = step_blk.ge(0)
    big = torch.iinfo(step_blk.dtype).max
    tmp = step_blk.masked_fill(~valid, big)
    min_vals, _ = tmp.min(dim=1, keepdim=True)
    pmask_blk = step_blk.eq(min_vals) & valid
    if not pmask_blk.any():
        return None, None, step_map_b, False
    ge_mask_blk = step_blk.ge(min_vals) & valid
    pmask_tail = pmask_blk.view(-1)[:L1]
    ge_mask_tail = ge_mask_blk.view(-1)[:L1]
    pmask_b = torch.zeros(L0 + L1, dtype=torch.bool)
    pmask_b[L0:] = pmask_tail
    tail = input_ids_b[L0:L0 + L1].clone()
    tail[ge_mask_tail] = mask_id
    extended_input_ids_b = torch.empty(L0 + L1 + L1, dtype=input_ids_b.dtype)
    extended_input_ids_b[:L0 + L1] = input_ids_b
    extended_input_ids_b[L0 + L1:] = tail
    new_step_map_b = step_map_b.clone()
    new_step_map_b[pmask_tail] = -1
    return extended_input_ids_b, pmask_b, new_step_map_b, True


def ref_sdar_rows(input_ids, step_map_list, reward, L0, block_size, mask_id, pad_id, shrink, pad_resp_of):
    """rl_sdar.py collect_training_data, TraceRL branch, post_num = 0; ``pad_resp_of`` (B, L1) are the
    response's pad tokens (here: the tokens after the first EOS)."""
    B, L = input_ids.shape
    L1 = L - L0
    step_map_list = [list(x) for x in step_map_list]
    for b in range(B):
        step_map_i = step_map_list[b]
        for j in range(int((L1 - 1) / block_size) + 1):
            start, end = j * block_size, min(L1, (j + 1) * block_size)
            step_map_list[b][start:end] = ref_collapse_k_unique(step_map_i[start:end], shrink)
    step_map = torch.as_tensor(step_map_list, dtype=torch.long)
    ext_list, pmask_list, reward_list, owner = [], [], [], []
    for b in range(B):
        step_b = step_map[b]
        while True:
            ext_b, pmask_b, step_b, has_any = ref_one_round_vectorized(input_ids[b], step_b, L0, L1, block_size, mask_id)
            if not has_any:
                break
            ext_list.append(ext_b)
            pmask_list.append(pmask_b)
            reward_list.append(reward[b])
            owner.append(b)
    extended_input_ids = torch.stack(ext_list, dim=0)
    p_mask = torch.stack(pmask_list, dim=0).to(torch.bool)
    pad = torch.cat([torch.zeros(B, L0, dtype=torch.bool), pad_resp_of], 1)[owner]  # (rows, L)
    pad_resp = pad & p_mask
    cum_pad = torch.cumsum(pad_resp.int(), dim=1)
    p_mask &= ~(pad_resp & (cum_pad > 0))
    labels = extended_input_ids[:, :L].clone()
    idx = torch.arange(L).unsqueeze(0).expand(extended_input_ids.shape[0], -1)
    valid = (idx >= L0) | extended_input_ids[:, :L].ne(pad_id)
    tok_idx = valid.long().cumsum(dim=-1) - 1
    tok_idx = tok_idx.masked_fill(~valid, 1)
    tok_idx_ext = torch.cat([tok_idx, tok_idx[:, L0:]], dim=1)
    keep = p_mask.view(p_mask.size(0), -1).any(dim=1)
    idx = keep.nonzero(as_tuple=True)[0]
    return (extended_input_ids[idx], p_mask[idx], tok_idx_ext[idx], labels[idx],
            [reward_list[i] for i in idx.tolist()])


def ref_make_basic_block_attention(N, start_pos, block_size):
    B = 1
    L0 = start_pos
    L1 = (N - L0) // 2
    bias = torch.full((B, 1, N, N), 0)
    rows = torch.arange(L0 + L1, L0 + 2 * L1)
    rows_token = torch.arange(L0, L0 + L1)
    for bi in range((L1 + block_size - 1) // block_size):
        left_end = L0 + min((bi) * block_size, L1)
        right_start = L0 + L1 + (left_end - L0)
        i_start = bi * block_size
        i_end = min((bi + 1) * block_size, L1)
        block_rows = rows[i_start:i_end]
        bias[:, :, block_rows.unsqueeze(-1), 0:left_end] = 1
        bias[:, :, block_rows.unsqueeze(-1), right_start:(right_start + block_size)] = 1
        block_rows = rows_token[i_start:i_end]
        left_end = L0 + min((bi + 1) * block_size, L1)
        bias[:, :, block_rows.unsqueeze(-1), 0:left_end] = 1
    if L0 > 0:
        num_blocks_pre = (L0 + block_size - 1) // block_size
        for bi in range(num_blocks_pre):
            row_end = max(L0 - bi * block_size, 0)
            row_start = max(L0 - (bi + 1) * block_size, 0)
            if row_end > row_start:
                block_rows = torch.arange(row_start, row_end)
                bias[:, :, block_rows.unsqueeze(-1), 0:row_end] = 1
    return bias


def ref_sdar_loss(logp_new_tok, logp_old_tok, p_mask, adv, eps, beta, L1):
    """rl_sdar.py forward_process, from the gathered token log-probs on."""
    adv = torch.as_tensor(adv).detach()
    B = p_mask.shape[0]
    ratio = logp_new_tok - logp_old_tok
    ratio = torch.where(p_mask, ratio, torch.zeros_like(ratio)).clamp(-10.0, 10.0)
    ratio = torch.exp(ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    adv_tok = adv.unsqueeze(1)
    surrogate_tok = torch.min(ratio * adv_tok, clipped * adv_tok)
    surrogate_tok = surrogate_tok * p_mask
    surrogate_tok = surrogate_tok.sum(dim=1) / L1
    policy_loss = -(surrogate_tok.sum() / B)
    kl_seq = logp_new_tok - logp_old_tok
    kl_seq = torch.where(p_mask, kl_seq, torch.zeros_like(kl_seq))
    t = (-kl_seq).clamp(-10.0, 10.0)
    kl_seq = t.exp() - 1.0 + kl_seq
    kl_seq = (kl_seq * p_mask).sum(dim=1) / L1
    kl_loss = beta * kl_seq.sum() / B
    return policy_loss + kl_loss


# ======================================================================= helpers
def cfg_of(norm, **kw):
    return TraceRLConfig(norm=norm, **kw)


def random_rows(B=6, L0=3, L1=8, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    new = -torch.rand(B, L0 + L1, generator=g) * 3
    old = new + scale * torch.randn(B, L0 + L1, generator=g)
    p_mask = torch.rand(B, L0 + L1, generator=g) < 0.5
    p_mask[:, :L0] = False
    p_mask[:, L0] = True  # every row trains a token (the public rows always do)
    adv = torch.randn(B, generator=g)
    return new, old, p_mask, adv


def objective_of(bundle, **kw):
    obj = TraceRL(TraceRLConfig(**kw), OneStepEstimator(LikelihoodConfig(), bundle.mask_token_id))
    obj.bind(bundle)
    return obj


def perturbed(net, seed=5, scale=0.05):
    new = copy.deepcopy(net)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return new


def binary_rewards(groups):
    return torch.tensor([float(x) for grp in groups for x in grp])


GROUPS = [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 1]]  # pass rates .25, 1 (dropped), .5, .25


# ======================================================================= 1. parity, random tensors
@pytest.mark.parametrize("norm", ["block", "masked"])
def test_loss_and_gradient_equal_the_public_loss_on_random_tensors(norm):
    for seed in range(3):
        new, old, p_mask, adv = random_rows(seed=seed)
        L0, L1 = 3, new.shape[1] - 3
        lp = new.clone().requires_grad_(True)
        ref = (ref_sdar_loss(lp, old, p_mask, adv, 0.2, 0.01, L1) if norm == "block"
               else ref_llada_loss(lp, old, p_mask.float(), adv, 0.2, 0.01))
        (g_ref,) = torch.autograd.grad(ref, lp)
        ours_lp = new[:, L0:].clone().requires_grad_(True)
        ours, _ = tracerl_loss(ours_lp, old[:, L0:], adv[:, None], p_mask[:, L0:].float(), cfg_of(norm), group_size=4)
        (g_ours,) = torch.autograd.grad(ours, ours_lp)
        assert ours.item() == pytest.approx(ref.item(), abs=1e-6, rel=1e-6)
        torch.testing.assert_close(g_ours, g_ref[:, L0:], atol=1e-7, rtol=1e-6)
        assert g_ref[:, :L0].abs().sum() == 0


def test_block_normalisation_clamps_the_log_ratio_and_masked_does_not():
    new, old, p_mask, adv = random_rows(seed=4)
    new[:, 3:] += 20 * p_mask[:, 3:]  # huge log-ratios on the trained tokens
    L1 = new.shape[1] - 3
    for norm in ("block", "masked"):
        ours, _ = tracerl_loss(new[:, 3:], old[:, 3:], adv[:, None], p_mask[:, 3:].float(), cfg_of(norm), group_size=4)
        ref = (ref_sdar_loss(new, old, p_mask, adv, 0.2, 0.01, L1) if norm == "block"
               else ref_llada_loss(new, old, p_mask.float(), adv, 0.2, 0.01))
        assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    block, _ = tracerl_loss(new[:, 3:], old[:, 3:], adv[:, None], p_mask[:, 3:].float(), cfg_of("block"), group_size=4)
    masked, _ = tracerl_loss(new[:, 3:], old[:, 3:], adv[:, None], p_mask[:, 3:].float(), cfg_of("masked"), group_size=4)
    assert math.isfinite(block.item()) and masked.item() > 1e5  # exp(20) KL terms are not clamped in rl_llada


def test_padding_rows_do_not_count():
    new, old, p_mask, adv = random_rows(seed=2)
    m = p_mask[:, 3:].float()
    for norm in ("block", "masked"):
        a, _ = tracerl_loss(new[:, 3:], old[:, 3:], adv[:, None], m, cfg_of(norm), group_size=4)
        pad = torch.zeros(3, new.shape[1] - 3)
        b, _ = tracerl_loss(torch.cat([new[:, 3:], pad]), torch.cat([old[:, 3:], pad + 7.0]),
                            torch.cat([adv, torch.ones(3)])[:, None], torch.cat([m, pad]), cfg_of(norm), group_size=4)
        assert a.item() == pytest.approx(b.item(), rel=1e-6)


# ======================================================================= 2. parity, real rollouts
def masked_rollout(bundle, shrink, G=4, steps=8, seed=3, groups=4):
    """The tiny masked model's rollout of ``groups`` groups with its recorded trajectory."""
    prompts = ["1203=", "4021=", "3300=", "0001="][:groups]  # one length: the public LLaDA forward has no mask
    ids, pmask = encode_prompts(bundle.tokenizer, [p for p in prompts for _ in range(G)])
    rec = TrajectoryRecorder(bundle.mask_token_id, record_greedy=False)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=steps, temperature=1.0)
    out = generate(logits_fn(bundle.net.eval()), ids, pmask, cfg, bundle.mask_token_id,
                   RowNoise.rows(seed, 0, ids.shape[0]), rec)
    return ids, pmask, out, rec


def rollout_with(bundle, ids, pmask, out, rec, groups=GROUPS, G=4):
    rewards = binary_rewards(groups)
    adv, _ = ZScoreAdvantage(ZScoreConfig())(rewards, G)
    comp = out.completion
    return rollout_of(ids, pmask, comp, completion_mask(comp, bundle.eos_token_id), rewards, adv, G,
                      trajectory=rec, sampler_logp=out.token_logp)


def never(rec, P):
    """(n, L) completion positions no step committed (the sampler drew the mask token at the last step)."""
    return rec.commit_step[:, P:].long() >= FILLED


def ref_advantages(groups):
    """Per sample: its z-score and whether rl_reward.py keeps its group."""
    adv, keep = [], []
    for rewards, kept in ref_reward_file(groups):
        adv += rewards
        keep += [kept] * len(rewards)
    return adv, keep


@pytest.mark.parametrize("shrink", [1, 2, 3])
def test_masked_model_loss_and_gradient_equal_the_public_code_on_a_recorded_rollout(tiny_bundle, shrink):
    bundle = tiny_bundle
    ids, pmask, out, rec = masked_rollout(bundle, shrink)
    ro = rollout_with(bundle, ids, pmask, out, rec)
    old_net, new_net = bundle.net.eval(), perturbed(bundle.net).eval()
    obj = objective_of(bundle, shrink=shrink, pass_threshold=1.0)
    ctx = StepContext(ro, 0, 0, logits_fn(new_net), logits_fn(old_net), None)
    ours, metrics = obj.loss(ctx)
    params = [p for p in new_net.parameters()]
    g_ours = torch.autograd.grad(ours, params)

    # the public pipeline: rewards -> z-scores + filter -> rows from the step map -> forward_process
    P = ids.shape[1]
    adv, keep = ref_advantages(GROUPS)
    kept = [b for b in range(ids.shape[0]) if keep[b]]
    input_ids = torch.cat([ids, out.completion], 1)[kept]
    step_map = rec.commit_step[kept, P:].tolist()
    # what the public code leaves out as pads: after the first EOS, and (our fix, see the objective's
    # docstring) positions the sampler left masked, to which the public step map would give step 0
    scored = completion_mask(out.completion, bundle.eos_token_id).bool()[kept] & ~never(rec, P)[kept]
    tail_pad = torch.cat([torch.zeros(len(kept), P, dtype=torch.bool), ~scored], 1)
    noisy, labels, p_mask, rewards = ref_llada_rows(input_ids, step_map, [adv[b] for b in kept], P,
                                                    bundle.mask_token_id, shrink, tail_pad)
    with torch.no_grad():
        old_lp = F.log_softmax(logits_fn(old_net)(noisy, None), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    new_lp = F.log_softmax(logits_fn(new_net)(noisy, None), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref = ref_llada_loss(new_lp, old_lp, p_mask.float(), rewards, 0.2, 0.01)
    g_ref = torch.autograd.grad(ref, params)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6, rel=1e-6)
    assert metrics["tracerl/rows"].item() == noisy.shape[0]
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def block_bundle():
    torch.manual_seed(0)
    return build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=4))


def block_rollout(bundle, G=4, seed=3):
    """Three 4-token blocks of completion, 2 steps each, after 8 prompt tokens (two whole blocks)."""
    prompts = ["1203=12=", "4021=33=", "3300=01=", "0001=22="]
    ids, pmask = encode_prompts(bundle.tokenizer, [p for p in prompts for _ in range(G)], pad_to_multiple_of=4)
    rec = TrajectoryRecorder(bundle.mask_token_id, record_greedy=False)
    cfg = SamplerConfig(gen_length=12, block_length=12, steps=6, temperature=1.0)
    out = block_generate(bundle.net.eval(), ids, pmask, cfg, 4, bundle.mask_token_id,
                         RowNoise.rows(seed, 0, ids.shape[0]), rec, use_cache=True)
    return ids, pmask, out, rec


@pytest.mark.parametrize("shrink", [1, 2])
def test_block_model_loss_and_gradient_equal_the_public_code_on_a_recorded_rollout(shrink):
    bundle = block_bundle()
    ids, pmask, out, rec = block_rollout(bundle)
    assert bool(pmask.all()) and ids.shape[1] % 4 == 0  # the public SDAR layout: prompt in whole blocks
    ro = rollout_with(bundle, ids, pmask, out, rec)
    old_net, new_net = bundle.net.eval(), perturbed(bundle.net).eval()
    obj = objective_of(bundle, shrink=shrink, pass_threshold=1.0)
    assert obj.cfg.norm == "block"
    ours, metrics = obj.loss(StepContext(ro, 0, 0, logits_fn(new_net), logits_fn(old_net), None))
    params = list(new_net.parameters())
    g_ours = torch.autograd.grad(ours, params)

    P, L = ids.shape[1], out.completion.shape[1]
    adv, keep = ref_advantages(GROUPS)
    kept = [b for b in range(ids.shape[0]) if keep[b]]
    input_ids = torch.cat([ids, out.completion], 1)[kept]
    scored = completion_mask(out.completion, bundle.eos_token_id).bool()[kept] & ~never(rec, P)[kept]
    ext, p_mask, tok_idx_ext, labels, rewards = ref_sdar_rows(
        input_ids, rec.commit_step[kept, P:].tolist(), [adv[b] for b in kept], P, 4, bundle.mask_token_id, bundle.pad_token_id,
        shrink, ~scored)
    attn = ref_make_basic_block_attention(P + 2 * L, P, 4).repeat_interleave(ext.shape[0], dim=0).bool()

    def token_lp(net):
        logits = net(input_ids=ext, attention_mask=attn, position_ids=tok_idx_ext).logits.float()
        logits = torch.cat([logits[:, :P, :], logits[:, P + L:, :]], dim=1)
        return F.log_softmax(logits, dim=-1).gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        old_lp = token_lp(old_net)
    ref = ref_sdar_loss(token_lp(new_net), old_lp, p_mask, rewards, 0.2, 0.01, L)
    g_ref = torch.autograd.grad(ref, params)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6, rel=1e-6)
    assert metrics["tracerl/rows"].item() == ext.shape[0]
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_advantages_and_group_filter_equal_the_reward_file():
    groups = [[1, 0, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]]
    ours, _ = ZScoreAdvantage(ZScoreConfig())(binary_rewards(groups), 5)
    adv, keep = ref_advantages(groups)
    torch.testing.assert_close(ours, torch.tensor(adv, dtype=torch.float32), atol=1e-7, rtol=0)
    ro = rollout_of(torch.ones(25, 2, dtype=torch.long), torch.ones(25, 2, dtype=torch.long),
                    torch.ones(25, 4, dtype=torch.long), torch.ones(25, 4), binary_rewards(groups), ours, 5)
    obj = TraceRL(TraceRLConfig(pass_threshold=1.0), OneStepEstimator(LikelihoodConfig(), 0))
    kept = obj.kept_samples(StepContext(ro, 0, 0, None, None, None))
    assert kept.tolist() == keep  # 1/5 = 0.2 and 4/5 = 0.8 are kept, as in the public comparison


# ======================================================================= 3. rounds and rows


def test_masked_rows_are_the_recorded_states_before_each_step(tiny_bundle):
    """shrink = 1: row r of a sample is the sampler's own input at its r-th step (state_before), and
    at theta = theta_old its old log-probs are the sampler's recorded ones."""
    ids, pmask, out, rec = masked_rollout(tiny_bundle, 1)
    ro = rollout_with(tiny_bundle, ids, pmask, out, rec, groups=[[1, 0, 0, 0]] * 4)
    obj = objective_of(tiny_bundle)  # pass_threshold=null: groups whose rewards differ
    P = ids.shape[1]
    ctx = StepContext(ro, 0, 0, logits_fn(tiny_bundle.net), logits_fn(tiny_bundle.net), None)
    b = obj._batch(ctx)
    for k in range(b.sample.numel()):
        j, r = int(b.sample[k]), int(b.round[k])
        steps = sorted({s for s in rec.commit_step[j, P:].tolist()})
        state = rec.state_before(steps[r])[j, P:]
        assert torch.equal(out.completion[j].masked_fill(b.masked[k], tiny_bundle.mask_token_id), state)
    old = obj.logp_units(ctx, ctx.old_policy, "old")
    q = obj.sampler_units(ctx)
    torch.testing.assert_close(old.logp * old.mask, q, atol=2e-5, rtol=0)


def test_block_rows_score_each_block_as_the_sampler_saw_it():
    """A staircase row of round r gives, per block, the log-probs of the sampler's own state before that
    block's r-th step (the recorded state_before, run through the model's block-causal attention)."""
    bundle = block_bundle()
    ids, pmask, out, rec = block_rollout(bundle)
    ro = rollout_with(bundle, ids, pmask, out, rec, groups=[[1, 0, 0, 0]] * 4)
    obj = objective_of(bundle)
    fwd = logits_fn(bundle.net.eval())
    ctx = StepContext(ro, 0, 0, fwd, fwd, None)
    s = obj.logp_units(ctx, fwd, "old")
    P = ids.shape[1]
    b = obj._batch(ctx)
    T = rec.num_steps
    for t in range(T):
        state = rec.state_before(t)  # (n, P+L)
        committed = rec.commit_step == t
        if not committed.any():
            continue
        lp = F.log_softmax(fwd(state, torch.ones_like(state)), -1).gather(-1, rec.final.unsqueeze(-1)).squeeze(-1)
        for j, i in committed[:, P:].nonzero().tolist():
            k = ((b.sample == j) & b.trained[:, i]).nonzero()
            if k.numel():
                assert s.logp[int(k)][i].item() == pytest.approx(lp[j, P + i].item(), abs=2e-5)
    torch.testing.assert_close(s.logp * s.mask, obj.sampler_units(ctx), atol=2e-5, rtol=0)


def test_inner_updates_cover_every_row_once(tiny_bundle):
    ids, pmask, out, rec = masked_rollout(tiny_bundle, 1)
    ro = rollout_with(tiny_bundle, ids, pmask, out, rec)
    obj = objective_of(tiny_bundle, mu=3, pass_threshold=1.0)
    ctx = StepContext(ro, 0, 0, None, None, None)
    seen = []
    for it in range(3):
        ctx.inner_iter = it
        b = obj._batch(ctx)
        seen += list(zip(b.sample.tolist(), b.round.tolist()))
    plan = obj.plan(ctx)
    assert seen == list(zip(plan.sample.tolist(), plan.round.tolist()))  # in order, no repeats
    kept = {j for j, _ in seen}
    assert kept == {j for j in range(16) if GROUPS[j // 4] != [1, 1, 1, 1]}


# ======================================================================= 4. invariants
def test_ratio_one_clips_nothing_and_has_no_kl_hand_computed():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[2.0], [-1.0]])
    for norm, expect in (("masked", -(2.0 + -1.0) / 2), ("block", -((2 * 2) / 3 + (-1) / 3) / 2)):
        loss, m = tracerl_loss(logp, logp.detach().clone(), adv, mask, cfg_of(norm), group_size=2)
        assert loss.item() == pytest.approx(expect)
        assert m["ratio/clip_frac_low"].item() == 0 and m["ratio/clip_frac_high"].item() == 0
        assert m["tracerl/kl_old"].item() == 0
        (g,) = torch.autograd.grad(loss, logp)
        w = torch.tensor([[0.5, 0.5, 0], [1.0, 0, 0]]) if norm == "masked" else torch.full((2, 3), 1 / 3) * mask
        torch.testing.assert_close(g, -adv * w * mask / 2)  # the KL's gradient is 0 at ratio 1


def test_zero_advantages_give_zero_policy_gradient_and_the_kl_pulls_back():
    new, old, p_mask, _ = random_rows(seed=7, scale=0.5)
    for norm in ("block", "masked"):
        lp = new[:, 3:].clone().requires_grad_(True)
        loss, _ = tracerl_loss(lp, old[:, 3:], torch.zeros(6, 1), p_mask[:, 3:].float(), cfg_of(norm, beta_old=0.0),
                               group_size=4)
        assert torch.autograd.grad(loss, lp)[0].abs().max() == 0
        loss, _ = tracerl_loss(lp, old[:, 3:], torch.zeros(6, 1), p_mask[:, 3:].float(), cfg_of(norm), group_size=4)
        (g,) = torch.autograd.grad(loss, lp)
        d = (lp - old[:, 3:]).detach()
        assert torch.all((g * d)[p_mask[:, 3:]] > 0)  # descent moves logp back towards the rollout policy


def test_clip_stops_the_gradient_outside_the_trust_region():
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    old = torch.zeros(1, 2)
    loss, m = tracerl_loss(logp, old, torch.tensor([[1.0]]), torch.ones(1, 2), cfg_of("masked", beta_old=0.0),
                           group_size=1)
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0, 0] == 0 and g[0, 1] != 0  # above 1 + eps with A > 0: clipped; below 1 - eps: not
    assert m["ratio/clip_frac_high"].item() == 0.5 and m["ratio/clip_frac_low"].item() == 0


def test_all_masked_is_finite_and_on_the_graph(tiny_bundle):
    for norm in ("block", "masked"):
        loss, _ = tracerl_loss(torch.zeros(3, 4, requires_grad=True), torch.full((3, 4), -50.0), torch.ones(3, 1),
                               torch.zeros(3, 4), cfg_of(norm), group_size=3)
        assert loss.item() == 0
    # every group's rewards agree: no row, one empty row through the model, zero gradient
    ids, pmask, out, rec = masked_rollout(tiny_bundle, 1)
    ro = rollout_with(tiny_bundle, ids, pmask, out, rec, groups=[[1, 1, 1, 1]] * 4)
    obj = objective_of(tiny_bundle)
    net = tiny_bundle.net
    loss, m = obj.loss(StepContext(ro, 0, 0, logits_fn(net), logits_fn(net), None))
    assert loss.item() == 0 and m["tracerl/kept_frac"].item() == 0
    loss.backward()
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in net.parameters())


def test_zscore_hand_computed_and_zero_std():
    adv, _ = ZScoreAdvantage(ZScoreConfig())(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.3]), 4)
    std = math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 4)  # population std
    assert adv[:4].tolist() == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])
    assert adv[4:].tolist() == [0.0] * 4  # rewards that agree (up to float rounding) give 0


def test_truncated_completions_can_be_scored_as_wrong(tmp_path):
    from diffusion_rl.app.train import build
    from diffusion_rl.rl.rollout import RolloutConfig, RolloutEngine

    c = build(compose_cfg(["objective=tracerl", "sampler.gen_length=24", "sampler.block_length=24"], tmp_path))
    items = c.task.splits.train[:2]
    for seed in range(3, 40):  # a rollout holding both kinds (which seed gives one depends on the sampler's noise)
        plain = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=seed)(items, c.bundle.net, 0)
        no_eos = ~(plain.completion_ids == c.bundle.eos_token_id).any(-1)
        if no_eos.any() and (~no_eos).any():
            break
    else:
        pytest.fail("no seed gave a rollout with both ended and truncated completions")
    cut = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, RolloutConfig(truncated_reward=-1.0), seed=seed)(
        items, c.bundle.net, 0)
    assert torch.equal(cut.rewards, torch.where(no_eos, -1.0, plain.rewards))
    assert cut.metrics["rollout/truncated_frac"] == pytest.approx(no_eos.float().mean().item())


# ======================================================================= 5. config
@pytest.mark.parametrize("override, key", [
    (dict(eps=1.5), "objective.eps"), (dict(beta_old=-1.0), "objective.beta_old"),
    (dict(kl_estimator="k2"), "objective.kl_estimator"), (dict(shrink=0), "objective.shrink"),
    (dict(norm="mean"), "objective.norm"), (dict(pass_min=0.9, pass_max=0.5), "objective.pass_min"),
    (dict(shrink=2, behaviour_correction="tis"), "objective.behaviour_correction"),
])
def test_nonsense_options_fail_in_one_line(override, key):
    with pytest.raises(ConfigError) as err:
        TraceRLConfig(**override).validate()
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_wrong_pieces_fail_at_start_up_in_one_line(tmp_path):
    from diffusion_rl.app.train import build

    for overrides, key in ((["likelihood=elbo"], "likelihood.name"), (["advantage=stepwise"], "advantage.name")):
        with pytest.raises(ConfigError) as err:
            build(compose_cfg(["objective=tracerl", *overrides], tmp_path))
        assert str(err.value).startswith(key) and "\n" not in str(err.value)
    obj = TraceRL(TraceRLConfig(), OneStepEstimator(LikelihoodConfig(), 0))
    with pytest.raises(ConfigError, match="model.custom_attention_mask"):
        obj.bind(SimpleNamespace(block_size=4, custom_attention_mask=False))
    with pytest.raises(ValueError, match="norm"):  # an unbound objective's loss cannot guess the model
        tracerl_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 1), torch.ones(1, 2), TraceRLConfig(),
                     group_size=1)


def test_the_yaml_selects_zscore_and_the_norm_follows_the_model(tmp_path):
    from diffusion_rl.app.train import build

    c = build(compose_cfg(["objective=tracerl"], tmp_path))
    assert c.advantage.cfg.name == "zscore" and c.objective.cfg.norm == "masked" and c.objective.cfg.beta == 0
    c = build(compose_cfg(["objective=tracerl", "model=tiny_block", "sampler.steps=8"], tmp_path))
    assert c.objective.cfg.norm == "block" and c.objective.block_size == 4


def test_zscore_config_error_is_one_line():
    with pytest.raises(ConfigError) as err:
        ZScoreConfig(zero_std=0.0).validate()
    assert str(err.value).startswith("advantage.zero_std") and "\n" not in str(err.value)


# ======================================================================= 6. two processes
def _losses_on(shard, mu=2):
    """The loss of every inner update of one rollout (3 groups of 4, the second spanning both halves),
    computed by the process ``shard`` describes from its own rows."""
    from dataclasses import replace

    torch.manual_seed(0)
    bundle = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))
    ids, pmask, out, rec = masked_rollout(bundle, 1, groups=3)
    full = rollout_with(bundle, ids, pmask, out, rec, groups=GROUPS[:3])
    rows = shard.rows(ids.shape[0])
    local = torch.arange(ids.shape[0])[rows]
    ro = rollout_of(ids[rows], pmask[rows], full.completion_ids[rows], full.completion_mask[rows], full.rewards[rows],
                    full.advantages[rows], 4, shard=shard, trajectory=rec.select(local),
                    sampler_logp=out.token_logp[rows])
    ro = replace(ro, all_rewards=full.rewards)
    obj = objective_of(bundle, mu=mu, pass_threshold=1.0)
    ctx = StepContext(ro, 0, 0, logits_fn(perturbed(bundle.net).eval()), logits_fn(bundle.net.eval()), None)
    out_losses = []
    for it in range(mu):
        ctx.inner_iter = it
        loss, m = obj.loss(ctx)
        out_losses.append((loss.item(), m["tracerl/rows"].item()))
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
    """Gloo, two processes with 6 rows each: the rows padded to a common count, the updates' shares
    cut from the global row list, the filter on every process's rewards."""
    import torch.multiprocessing as mp

    from diffusion_rl.core.distributed import Shard

    one = _losses_on(Shard())
    assert one[0][1] > 0 and one[1][1] > 0  # both updates train rows
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        two = torch.load(tmp_path / f"{rank}.pt")
        for (a, ra), (b, rb) in zip(one, two):
            assert ra == rb and b == pytest.approx(a, abs=1e-6, rel=1e-6)
