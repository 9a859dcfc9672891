"""IGPO (rl/objectives/igpo.py): parity with a transcription of the public loss and entropy filter, the
hinted resampling's invariants, the hint placement and configs.

The reference below is written from facebookresearch/igpo @ e85eaea, ``trainer_igpo.py``
(``compute_loss`` L593-686 with ``use_gspo=true``, ``_get_per_token_logps_grpo`` L1043-1155 with
``d1_masking=true``, the entropy filter L1764-1827), in its operations and order, and imports nothing
from the project's implementation. Its token mean spans the micro-batch it is given; the released run
gives it one group.
"""

import copy
import random
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext, agg_loss, kl_penalty
from diffusion_rl.rl.objectives.igpo import (
    IGPOConfig,
    entropy_filter,
    hint_chunks,
    igpo_loss,
    replacement_plan,
)
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.tasks.base import Task
from tests.helpers.common import compose_cfg

# ---------------------------------------------------------------- the public code, transcribed


def public_logps_and_entropy(logits, input_ids, logits_to_keep):
    """_get_per_token_logps_grpo after the forward (one iteration): logits (b, l, V) -> (1, b, L) twice."""
    batch_size = input_ids.shape[0]
    completion_logits = logits[:, -logits_to_keep:, :]
    completion_targets = input_ids[:, -logits_to_keep:]
    completion_probs = F.softmax(completion_logits, dim=-1)
    completion_entropy = -torch.sum(completion_probs * torch.log(completion_probs + 1e-8), dim=-1)
    flat_logits = completion_logits.reshape(-1, completion_logits.size(-1))
    flat_targets = completion_targets.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_targets, reduction="none")
    completion_log_probs = -loss.view(batch_size, logits_to_keep)
    per_token_logps = completion_log_probs.view(1, batch_size, logits_to_keep)
    return per_token_logps.to(torch.float32), completion_entropy.view(1, batch_size, logits_to_keep).to(torch.float32)


def public_entropy_filter(masked_token_mask, completion_inpaint_mask, all_per_token_entropy, entropy_keep_ratio=0.2):
    """The entropy filter of _generate_and_score_completions: (it, b, L) uint8, (b, L) bool, (it, b, L)."""
    filtered_masked_token_mask = masked_token_mask.clone()
    for iter_idx in range(masked_token_mask.shape[0]):
        iter_entropy = all_per_token_entropy[iter_idx]
        iter_masked_pos = masked_token_mask[iter_idx]
        for batch_idx in range(completion_inpaint_mask.shape[0]):
            masked_and_inpainted = iter_masked_pos[batch_idx].bool() & completion_inpaint_mask[batch_idx]
            if masked_and_inpainted.any():
                candidate_entropy = iter_entropy[batch_idx][masked_and_inpainted]
                num_candidates = masked_and_inpainted.sum().item()
                top_k = max(1, int(num_candidates * entropy_keep_ratio))
                _, top_indices_relative = torch.topk(candidate_entropy, top_k, largest=True)
                candidate_absolute_indices = masked_and_inpainted.nonzero(as_tuple=True)[0]
                top_indices_absolute = candidate_absolute_indices[top_indices_relative]
                keep_mask = torch.zeros_like(completion_inpaint_mask[batch_idx], dtype=torch.bool)
                keep_mask[top_indices_absolute] = True
                is_inpainted = completion_inpaint_mask[batch_idx]
                filtered_masked_token_mask[iter_idx, batch_idx] = (
                    iter_masked_pos[batch_idx].bool() & (~is_inpainted | keep_mask)).to(torch.uint8)
    return filtered_masked_token_mask


def public_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, token_mask, beta=0.01,
                epsilon_low=0.2, epsilon_high=0.2):
    """compute_loss with use_gspo=true on one micro-batch: (B, T) each, advantages (B,)."""
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    sequence_logps = per_token_logps.sum(dim=1) / per_token_logps.size(1)
    old_sequence_logps = old_per_token_logps.sum(dim=1) / old_per_token_logps.size(1)
    sequence_ratio = torch.exp(sequence_logps - old_sequence_logps)
    policy_ratio = sequence_ratio.unsqueeze(1).expand(-1, per_token_logps.size(1))
    coef_1 = policy_ratio
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages.unsqueeze(1)
    per_token_loss2 = coef_2 * advantages.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    per_token_loss = per_token_loss + beta * per_token_kl
    denom = token_mask.sum()
    if denom == 0:
        return per_token_loss.new_tensor(0.0)
    return (per_token_loss * token_mask).sum() / denom


def public_over_groups(logps, old, ref, adv, token_mask, G, beta=0.01):
    """The released run: one group per micro-batch, gradients averaged over accumulation steps."""
    return torch.stack([public_loss(logps[g:g + G], old[g:g + G], ref[g:g + G], adv[g:g + G], token_mask[g:g + G], beta)
                        for g in range(0, adv.shape[0], G)]).mean()


def ours(logp, old, ref, adv, mask, hints, entropy, G, cfg=None):
    cfg = cfg or IGPOConfig()
    kept = entropy_filter(mask, hints, entropy, cfg.hint_entropy_keep)
    loss, _ = igpo_loss(logp, old, adv[:, None], kept, cfg, group_size=G)
    return loss + cfg.beta * agg_loss(kl_penalty(logp, ref), kept, "group-token-mean", G)


# ---------------------------------------------------------------- parity on random tensors


def test_loss_and_filter_parity_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    G, B, P, L, V = 4, 12, 3, 24, 7
    for _ in range(4):
        logits = (torch.randn(B, P + L, V, generator=g) * 2).requires_grad_(True)
        ids = torch.randint(0, V, (B, P + L), generator=g)
        old = (logits.detach() + 0.3 * torch.randn(B, P + L, V, generator=g))
        ref = (logits.detach() + 0.3 * torch.randn(B, P + L, V, generator=g))
        lengths = torch.randint(L // 2, L + 1, (B,), generator=g)
        mask = (torch.arange(L)[None] < lengths[:, None]).long()
        hints = (torch.rand(B, L, generator=g) < 0.4) & (torch.arange(B)[:, None] % 2 == 0)  # half the rows hinted
        adv = torch.randn(B, generator=g)
        logp, _ = public_logps_and_entropy(logits, ids, L)
        old_logp, entropy = public_logps_and_entropy(old, ids, L)
        ref_logp, _ = public_logps_and_entropy(ref, ids, L)
        token_mask = public_entropy_filter(mask[None].to(torch.uint8), hints, entropy)[0]
        expected = public_over_groups(logp[0], old_logp[0], ref_logp[0], adv, token_mask, G)
        g_ref, = torch.autograd.grad(expected, logits)
        logp, _ = public_logps_and_entropy(logits, ids, L)  # a fresh graph for our side
        got = ours(logp[0], old_logp[0], ref_logp[0], adv, mask, hints, entropy[0], G)
        g_ours, = torch.autograd.grad(got, logits)
        assert torch.equal(entropy_filter(mask, hints, entropy[0], 0.2).to(torch.uint8), token_mask)
        assert got.item() == pytest.approx(expected.item(), abs=1e-6)
        assert torch.allclose(g_ours, g_ref, atol=1e-6)


def test_keeping_every_hint_token_differs():
    """The filter is in the loss: a transcription that keeps every hint token gives another value."""
    g = torch.Generator().manual_seed(1)
    B, L, G = 4, 20, 4
    logp, old, ref = (-torch.rand(B, L, generator=g) * 3 for _ in range(3))
    mask = torch.ones(B, L, dtype=torch.long)
    hints = torch.zeros(B, L, dtype=torch.bool)
    hints[0, :12] = True
    entropy = torch.rand(B, L, generator=g)
    adv = torch.tensor([1.0, -0.5, -0.25, -0.25])
    filtered = public_over_groups(logp, old, ref, adv, public_entropy_filter(mask[None].to(torch.uint8), hints,
                                                                               entropy[None])[0], G)
    unfiltered = public_over_groups(logp, old, ref, adv, mask, G)
    got = ours(logp, old, ref, adv, mask, hints, entropy, G)
    assert got.item() == pytest.approx(filtered.item(), abs=1e-6)
    assert got.item() != pytest.approx(unfiltered.item(), abs=1e-3)


# ---------------------------------------------------------------- the filter and the plan


def test_filter_keeps_the_top_share_of_hint_tokens_and_leaves_the_rest():
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 10:] = 0  # past EOS
    hints = torch.zeros(2, 12, dtype=torch.bool)
    hints[0, :10] = True
    hints[1, 5:12] = True
    entropy = torch.arange(24, dtype=torch.float).view(2, 12)
    kept = entropy_filter(mask, hints, entropy, 0.2)
    assert kept[0, :10].tolist() == [0] * 8 + [1, 1]  # int(10 * 0.2) = 2 highest entropies
    assert kept[0, 10:].tolist() == [1, 1]  # generated tokens untouched
    assert kept[1, :5].tolist() == [1] * 5 and kept[1, 5:10].tolist() == [0, 0, 0, 0, 1]  # max(1, int(5 * 0.2))
    assert kept[1, 10:].tolist() == [0, 0]  # outside the mask stays out
    assert torch.equal(entropy_filter(mask, None, None, 0.2), mask)


def test_replacement_plan_takes_only_correct_rows_and_at_most_the_cap():
    gen = torch.Generator().manual_seed(0)
    correct = torch.tensor([False, True, True, False, True, True, True, False])
    for _ in range(10):
        plan = replacement_plan(correct, 4, gen)
        assert len(plan) == 4 and len(set(plan)) == 4 and all(correct[p] for p in plan)
    assert replacement_plan(torch.tensor([False, True, False]), 4, gen) == [1]
    assert replacement_plan(torch.zeros(4, dtype=torch.bool), 4, gen) == []


def test_hint_chunks_leave_the_tail_free_show_the_last_chunk_and_stretch_gaps():
    cfg = IGPOConfig()
    for seed in range(20):
        for frac in (0.2, 0.4, 0.6):
            chunks = hint_chunks(100, 256, frac, cfg, random.Random(seed), positional=False)
            assert chunks and all(c + n <= 256 - cfg.free_tail for _, c, n in chunks)
            assert all(cfg.min_chunk <= n <= cfg.max_chunk for _, _, n in chunks)
            starts = [c for _, c, _ in chunks]
            assert starts == sorted(starts)
            # the gaps stretch by min(226 / 100, 1.5) = 1.5
            for (s0, c0, n0), (s1, c1, _) in zip(chunks, chunks[1:]):
                assert c1 - (c0 + n0) == min(int((s1 - (s0 + n0)) * 1.5), cfg.max_spacing)
    # the last chunk of the reference is always shown: its end is the last cut the chunking made
    rng_a, rng_b = random.Random(3), random.Random(3)
    shown = hint_chunks(100, 256, 0.2, cfg, rng_a, positional=False)
    sizes, i = [], 0
    while i < 100:
        size = min(rng_b.randint(cfg.min_chunk, cfg.max_chunk), 100 - i)
        if size < cfg.min_chunk:
            break
        sizes.append(size)
        i += size
    assert shown[-1][0] + shown[-1][2] == sum(sizes)
    assert hint_chunks(16, 16, 0.5, cfg, random.Random(0), positional=True) == []  # the tail covers it all
    tiny = replace(cfg, free_tail=0, min_chunk=2, max_chunk=4)
    assert all(s == c for s, c, _ in hint_chunks(16, 16, 0.5, tiny, random.Random(0), positional=True))


# ---------------------------------------------------------------- real rollouts


def igpo_setup(tmp_path, monkeypatch, hinted_correct, extra=()):
    """The objective built from the configs (the tiny testbed: hints of 2-4 cells, no free tail; the public
    run's clear prompt) and a
    rollout of the untrained tiny model where every first sample is wrong and the hinted samples of the
    rows ``hinted_correct`` (group-relative) are right. Returns the config bundle, the rollout and the
    rollout before the objective revised it."""
    torch.manual_seed(0)
    c = build(compose_cfg(["objective=igpo", "task.pin_givens=false", "sampler.remasking=low_confidence",
                          "likelihood.p_mask_prompt=0", *extra],
                          tmp_path))
    calls = []

    def correctness(texts, items):
        calls.append(len(texts))
        if len(calls) == 1:
            return [False] * len(texts)
        return [j in hinted_correct for j in range(len(texts))]

    monkeypatch.setattr(c.task, "correctness", correctness)
    before = []
    revise = c.objective.revise_rollout

    def spy(ro, tools):
        before.append(ro)
        return revise(ro, tools)

    monkeypatch.setattr(c.objective, "revise_rollout", spy)
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = engine(c.task.splits.train[:2], c.bundle.net, 0)
    return c, ro, before[0]


def test_hinted_rows_replace_the_first_rows_and_keep_their_hints(tmp_path, monkeypatch):
    c, ro, before = igpo_setup(tmp_path, monkeypatch, hinted_correct={1, 2, 3, 4, 5, 6},
                               extra=["task.group_size=8"])
    G = ro.group_size
    assert "hints" in ro.extras and "hint_entropy" in ro.extras
    hints = ro.extras["hints"]
    for g in range(2):
        rows = slice(g * G, (g + 1) * G)
        replaced = hints[rows].any(-1)
        assert replaced.tolist() == [True] * 4 + [False] * 4  # at most 4, the first rows
        assert torch.equal(ro.completion_ids[rows][4:], before.completion_ids[rows][4:])
    # a hint is the solution's own cell and survives sampling untouched
    for r in range(ro.completion_ids.shape[0]):
        sol = [c.bundle.tokenizer.encode(ch, add_special_tokens=False)[0] for ch in ro.items[r]["solution"]]
        where = hints[r].nonzero()[:, 0]
        assert all(int(ro.completion_ids[r, p]) == sol[p] for p in where.tolist())
    assert ro.metrics["igpo/all_wrong_frac"] == 1.0 and ro.metrics["igpo/replaced_frac"] == 0.5
    assert torch.equal(ro.all_rewards, ro.rewards)  # the advantages see the replaced rows' rewards
    assert torch.allclose(ro.advantages, ro.rewards - ro.rewards.view(-1, G).mean(-1).repeat_interleave(G))


def test_groups_with_a_right_sample_are_untouched(tmp_path, monkeypatch):
    torch.manual_seed(0)
    c = build(compose_cfg(["objective=igpo", "task.pin_givens=false"], tmp_path))
    monkeypatch.setattr(c.task, "correctness", lambda texts, items: [True] + [False] * (len(texts) - 1))
    engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, seed=3)
    ro = engine(c.task.splits.train[:2], c.bundle.net, 0)  # group 0 has a right sample, group 1 none
    G = ro.group_size
    assert ro.metrics["igpo/all_wrong_frac"] == 0.5
    grpo = build(compose_cfg(["objective=grpo", "task.pin_givens=false"], tmp_path))
    base = RolloutEngine(grpo.bundle, grpo.task, grpo.objective, grpo.advantage, c.sampler, seed=3)(
        c.task.splits.train[:2], c.bundle.net, 0)
    assert torch.equal(ro.completion_ids[:G], base.completion_ids[:G])
    assert "hints" not in ro.extras or not bool(ro.extras["hints"][:G].any())


def test_no_right_hinted_sample_changes_nothing(tmp_path, monkeypatch):
    c, ro, before = igpo_setup(tmp_path, monkeypatch, hinted_correct=set())
    assert "hints" not in ro.extras and torch.equal(ro.completion_ids, before.completion_ids)
    assert ro.metrics["igpo/replaced_frac"] == 0.0 and ro.metrics["igpo/rescued_frac"] == 0.0


def test_loss_parity_on_real_rollouts(tmp_path, monkeypatch):
    """The objective's loss on a tiny model's hinted rollout equals the transcription fed the same inputs
    (whole completion masked, prompt clear), the entropies its own from the old policy; gradients too."""
    c, ro, _ = igpo_setup(tmp_path, monkeypatch, hinted_correct={0, 2, 3})
    assert "hints" in ro.extras and bool(ro.extras["hints"].any())
    ro = replace(ro, advantages=torch.tensor([0.5, -0.25, 0.0, -0.25, 1.0, -1.0, 0.25, -0.25]))
    torch.manual_seed(1)
    net = c.bundle.net.eval()
    old = copy.deepcopy(net).requires_grad_(False)  # the old policy: the rollout's entropies are its
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.02 * torch.randn_like(p))
    ref = copy.deepcopy(net).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    seen = []

    def forward(ids, attn):
        seen.append((ids, attn))
        return logits_fn(net)(ids, attn)

    loss, _ = c.objective.loss(StepContext(ro, 1, 3, forward, logits_fn(old), logits_fn(ref)))
    params = list(net.parameters())
    g_ours = torch.autograd.grad(loss, params, allow_unused=True)
    ids, attn = seen[-1]
    P, L = ro.prompt_ids.shape[1], ro.completion_ids.shape[1]
    assert bool((ids[:, P:] == c.bundle.mask_token_id).all()) and not bool((ids[:, :P] == c.bundle.mask_token_id).any())
    batch = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    logp, _ = public_logps_and_entropy(logits_fn(net)(ids, attn), batch, L)
    with torch.no_grad():
        old_logp, entropy = public_logps_and_entropy(logits_fn(old)(ids, attn), batch, L)
        ref_logp, _ = public_logps_and_entropy(logits_fn(ref)(ids, attn), batch, L)
    hints = ro.extras["hints"]
    hinted = hints.any(-1)
    assert torch.allclose(ro.extras["hint_entropy"][hinted], entropy[0][hinted], atol=1e-5)
    token_mask = public_entropy_filter(ro.scored_mask[None].to(torch.uint8), hints, entropy)[0]
    assert int(token_mask.sum()) < int(ro.scored_mask.sum())  # the filter dropped hint tokens
    expected = public_over_groups(logp[0], old_logp[0], ref_logp[0], ro.advantages, token_mask, ro.group_size,
                                  c.objective.cfg.beta)
    g_ref = torch.autograd.grad(expected, params, allow_unused=True)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6, abs=1e-6)
    for a, b in zip(g_ours, g_ref):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=1e-5, atol=1e-6))


def test_theta_equals_old_gives_ratio_one(tmp_path, monkeypatch):
    c, ro, _ = igpo_setup(tmp_path, monkeypatch, hinted_correct={1})
    net = c.bundle.net.eval()
    old = copy.deepcopy(net).requires_grad_(False)
    _, m = c.objective.loss(StepContext(ro, 0, 3, logits_fn(net), logits_fn(old), None))
    assert m["ratio/log_min"].item() == 0.0 and m["ratio/log_max"].item() == 0.0
    assert m["ratio/clip_frac_low"].item() == 0.0 and m["ratio/clip_frac_high"].item() == 0.0
    assert 0 < m["igpo/hint_keep_frac"].item() < 1


# ---------------------------------------------------------------- configs and tasks


def test_tasks_without_a_reference_or_correctness_say_so(tmp_path):
    c = build(compose_cfg(["objective=igpo"], tmp_path))
    with pytest.raises(ConfigError, match="reference completion"):
        Task.hint_reference(c.task, c.task.splits.train[0])
    with pytest.raises(ConfigError, match="right"):
        Task.correctness(c.task, [""], c.task.splits.train[:1])
    item = c.task.splits.train[0]
    assert c.task.hint_reference(item) == list(item["solution"])
    assert c.task.correctness([item["solution"], "0" * 16], [item, item]) == [True, False]


@pytest.mark.parametrize("key,value", [("eps", 1.0), ("hint_frac_low", 0.7), ("free_tail", -1), ("min_chunk", 0),
                                       ("max_replacements", -1), ("hint_entropy_keep", 0.0), ("max_spacing", -1)])
def test_bad_values_fail_in_one_line(key, value):
    with pytest.raises(ConfigError, match=f"objective.{'hint_frac_high' if key == 'hint_frac_low' else 'max_chunk' if key == 'min_chunk' else key}"):
        IGPOConfig(**{key: value}).validate()
