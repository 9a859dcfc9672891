"""SPG's block-wise masks (likelihood/spg_blocks.py): their distribution against a transcription of the
public code's ``forward_process`` (block_random; facebookresearch/SPG @ a1c7120, ``spg/spg_trainer.py``),
written in its operations and order and importing nothing from the project's implementation; the
switches (block choice, later blocks scored, earlier blocks noised); EOS and prompt padding; the
states the sandwich in test_elbo.py enumerates. The objective is tested in tests/unit/rl/test_spg.py,
which reuses this transcription."""

import pytest
import torch

from diffusion_rl.likelihood.spg_blocks import SPGBlocksConfig, SPGBlocksEstimator

MASK = 99


# ---------------------------------------------------------------- the public code, transcribed


def public_block_random(batch, prompt_len, completion_mask, mask_id, num_t, block_length, min_t, max_t,
                        p_mask_prompt, g):
    """SPG's forward_process(forward_type="block_random", use_mask_prompt=True); its global RNG
    (set_seed) replaced by the generator ``g``. -> noisy batch (b, num_t, l), block mask."""
    b, seq_len = batch.shape
    prompt_index = torch.zeros(seq_len, dtype=torch.bool)
    prompt_index[:prompt_len] = True
    gen_length = (seq_len - prompt_index.sum()).item()
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    completion_num_blocks = (completion_mask.sum(-1) - 1) // block_length + 1
    assert num_t <= num_blocks
    indices = torch.arange(num_blocks).repeat(b, 1)
    for i in range(b):
        indices[i] = indices[i][torch.randperm(num_blocks, generator=g)] % completion_num_blocks[i]
    mask_block_idx = indices[:, :num_t]
    is_mask = torch.zeros((b, num_t, seq_len), dtype=torch.bool)
    block_mask = torch.ones((b, num_t, seq_len), dtype=torch.bool)
    for i in range(b):
        for j in range(num_t):
            is_mask[i, j, -(num_blocks - mask_block_idx[i, j]) * block_length:] = True
            if mask_block_idx[i, j] < num_blocks - 1:
                block_mask[i, j, -(num_blocks - mask_block_idx[i, j] - 1) * block_length:] = False
    completion_length = completion_mask.sum(-1)
    is_mask_following = torch.ones((b, num_t, seq_len), dtype=torch.bool)
    for i in range(b):
        for j in range(num_t):
            mask_length = min(block_length, completion_length[i] - block_length * mask_block_idx[i, j])
            assert mask_length > 0
            start_mask_num = max(int(mask_length * min_t), 1)
            end_mask_num = min(int(mask_length * max_t), mask_length)
            mask_num = torch.randint(start_mask_num, end_mask_num + 1, (1, 1), generator=g)
            idx = torch.arange(block_length).repeat(1, 1, 1)
            is_mask_next = idx < mask_num.unsqueeze(2)
            start = -(num_blocks - mask_block_idx[i, j]) * block_length
            if mask_block_idx[i, j] == num_blocks - 1 and mask_length == block_length:
                is_mask_following[i, j, start:] = is_mask_next[0, 0][torch.randperm(block_length, generator=g)]
            else:
                is_mask_following[i, j, start:start + mask_length] = \
                    is_mask_next[0, 0, :mask_length][torch.randperm(int(mask_length), generator=g)]
    completion_mask_append = torch.cat((torch.ones(b, num_t, prompt_len, dtype=torch.bool),
                                        completion_mask.unsqueeze(1).repeat(1, num_t, 1)), dim=2).to(torch.bool)
    t_p = torch.ones(b, num_t) * p_mask_prompt
    random_matrix = torch.rand((b, num_t, seq_len), generator=g)
    is_mask_prompt = ~is_mask & (random_matrix < t_p.unsqueeze(2))
    is_mask = is_mask_prompt | (is_mask & is_mask_following) | ~completion_mask_append
    noisy_batch = torch.where(is_mask, mask_id, batch.unsqueeze(1).repeat(1, num_t, 1))
    return noisy_batch, block_mask


# ---------------------------------------------------------------- parity


def test_block_masks_have_the_public_distribution():
    """Per-position masking rates, the masked count and t of likelihood=spg_blocks against the public
    forward_process over many draws: 3 blocks of 4, completions of 6 (m = 2: block 0 twice as likely),
    12, 4 and 1 tokens; prompt rows with and without padding."""
    P, L, bl, K, n = 3, 12, 4, 2, 3000
    lengths = torch.tensor([6, 12, 4, 1])
    cmask = (torch.arange(L)[None] < lengths[:, None]).long()
    B = len(lengths)
    batch = torch.arange(1, 1 + P + L).repeat(B, 1)
    g = torch.Generator().manual_seed(0)
    pub = torch.stack([public_block_random(batch, P, cmask, MASK, K, bl, 0.0, 1.0, 0.15, g)[0] for _ in range(n)])
    pub = pub == MASK  # (n, B, K, l)
    est = SPGBlocksEstimator(SPGBlocksConfig(num_samples=K, block_length=bl), MASK)
    d = est.draw(list(range(n * B)), torch.ones(n * B, P, dtype=torch.long), cmask.repeat(n, 1))
    ours = torch.cat([d.prompt_hit, d.noised], -1).view(K, n, B, P + L).permute(1, 2, 0, 3)  # (n, B, K, l)
    assert (ours.float().mean(0) - pub.float().mean(0)).abs().max() < 0.04  # per position, sample, row
    cm = cmask.bool()[None, :, None]
    count = lambda m: (m[..., P:] & cm).sum(-1)  # noqa: E731  masked completion tokens (n, B, K)
    for b in range(B):
        hist_p = torch.bincount(count(pub)[:, b].flatten(), minlength=L + 1).float() / (n * K)
        hist_o = torch.bincount(count(ours)[:, b].flatten(), minlength=L + 1).float() / (n * K)
        assert 0.5 * (hist_p - hist_o).abs().sum() < 0.05, b  # total variation
    t_pub = count(pub).float() / lengths[None, :, None]
    assert torch.allclose(d.t.view(K, n, B).permute(1, 2, 0), count(ours).float() / lengths[None, :, None])
    assert (t_pub.mean(0) - d.t.view(K, n, B).permute(1, 2, 0).mean(0)).abs().max() < 0.03
    # the permute quirk: with 3 blocks and 2 in the completion, block 0 twice as often as block 1
    assert d.block.view(K, n, B)[:, :, 0].float().mean().item() == pytest.approx(1 / 3, abs=0.03)


# ---------------------------------------------------------------- the masks' switches


def draw(**kw):
    """4000 rows: completions of 6, 12, 4 and 9 tokens in blocks of 4 (3 generation blocks)."""
    cmask = (torch.arange(12)[None] < torch.tensor([[6], [12], [4], [9]])).long().repeat(1000, 1)
    est = SPGBlocksEstimator(SPGBlocksConfig(num_samples=2, block_length=4, **kw), MASK)
    return est.draw(list(range(4000)), torch.ones(4000, 3, dtype=torch.long), cmask), cmask


def test_permute_gives_distinct_blocks_and_uniform_fixes_the_bias():
    d, cm = draw()
    row = torch.arange(4000) % 4
    full = row == 1  # 12 tokens: 3 blocks, every one reachable
    assert bool((d.block[0, full] != d.block[1, full]).all())  # the K samples start from distinct blocks
    u, _ = draw(block_choice="uniform")
    first = row == 0  # 6 tokens: m = 2 of n = 3 blocks
    assert u.block[:, first].float().mean().item() == pytest.approx(0.5, abs=0.04)
    assert d.block[:, first].float().mean().item() == pytest.approx(1 / 3, abs=0.04)
    assert bool((u.block < ((cm.sum(-1) - 1) // 4 + 1)).all())


def test_later_blocks_scored_or_not_and_earlier_blocks_noised_or_clean():
    d, cm = draw()
    pos = torch.arange(12)
    later = (pos // 4)[None, None] > d.block[..., None]  # (K, B, L)
    earlier = (pos // 4)[None, None] < d.block[..., None]
    assert bool((d.noised | ~later).all())  # later blocks always masked
    assert bool(((d.scored & later) == (later & cm.bool())).all())  # and scored (SPG's unused block mask)
    rate = d.noised[earlier].float().mean().item()
    assert rate == pytest.approx(0.15, abs=0.04)  # earlier blocks lose ~15% of their tokens
    assert torch.equal(d.scored, d.noised & cm.bool())
    s, _ = draw(score_later_blocks=False)
    later_s = (pos // 4)[None, None] > s.block[..., None]
    assert bool((s.noised | ~later_s).all()) and not bool((s.scored & later_s).any())
    assert torch.allclose(s.t, (s.noised & cm.bool()).sum(-1) / cm.sum(-1))  # t still counts them
    e, _ = draw(noise_earlier_blocks=False)
    assert not bool(e.noised[(pos // 4)[None, None] < e.block[..., None]].any())


def test_tokens_after_eos_masked_never_scored_and_prompt_padding_kept():
    d, cm = draw()
    assert bool(d.noised[:, ~cm.bool()].all()) and not bool(d.scored[:, ~cm.bool()].any())
    est = SPGBlocksEstimator(SPGBlocksConfig(p_mask_prompt=0.5), MASK)
    pm = torch.tensor([[0, 0, 1, 1]]).repeat(200, 1)
    dd = est.draw(list(range(200)), pm, torch.ones(200, 8, dtype=torch.long))
    assert not bool(dd.prompt_hit[:, :, :2].any()) and bool(dd.prompt_hit[:, :, 2:].any())


def test_estimator_draws_the_enumerated_two_token_states():
    """likelihood=spg_blocks on a 2-token completion draws the states ``exact_bounds`` in test_elbo.py weights."""
    est = SPGBlocksEstimator(SPGBlocksConfig(num_samples=1, p_mask_prompt=0.0), MASK)
    d = est.draw(list(range(4000)), torch.ones(4000, 1, dtype=torch.long), torch.ones(4000, 2, dtype=torch.long))
    m = d.scored[0]  # (n, 2)
    freq = [(m == torch.tensor(s)).all(-1).float().mean().item() for s in ([True, False], [False, True], [True, True])]
    assert freq == pytest.approx([0.25, 0.25, 0.5], abs=0.03)


# ---------------------------------------------------------------- scoring the draws


def test_the_draws_are_scored_as_spg_averages_them_row_by_row(tiny_bundle):
    """``sample``, ``reduce`` and a call against the rule written out row by row from the draws: each
    row of each sample is its prompt with the drawn prompt positions masked and its completion with the
    drawn positions masked (pinned tokens shown), one forward of that row alone; ``ELBO_k`` is the mean
    log-prob of the scored positions, ``t_k`` the draw's, and the ELBO the mean over samples. Left-padded
    prompts, an EOS (a hole in the completion mask), pinned tokens that are neither masked nor scored."""
    from diffusion_rl.models.policy import logits_fn

    net, mask = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    g = torch.Generator().manual_seed(3)
    prompt, comp = torch.randint(3, 30, (3, 5), generator=g), torch.randint(3, 30, (3, 8), generator=g)
    pmask, cmask = torch.ones_like(prompt), torch.ones_like(comp)
    pmask[1, :2] = 0
    cmask[2, 6:] = 0
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[0, [1, 6]] = True
    est = SPGBlocksEstimator(SPGBlocksConfig(num_samples=3, block_length=4, p_mask_prompt=0.3), mask)
    fwd, seeds = logits_fn(net), [5, 6, 7]
    with torch.no_grad():
        s = est.sample(fwd, prompt, pmask, comp, cmask, seeds, pinned)
        elbo = est(fwd, prompt, pmask, comp, cmask, seeds, pinned)
        d = est.draw(seeds, pmask, cmask)
        want, counted = torch.zeros(3, 3), 0
        for k in range(3):
            for b in range(3):
                ids_p = torch.where(d.prompt_hit[k, b], mask, prompt[b])
                ids_c = torch.where(d.noised[k, b] & ~pinned[b], mask, comp[b])
                attn = torch.cat([pmask[b], torch.ones(8, dtype=pmask.dtype)])[None]
                logp = fwd(torch.cat([ids_p, ids_c])[None], attn)[0, 5:].float().log_softmax(-1)
                lp = logp.gather(-1, comp[b, :, None])[:, 0]
                scored = d.scored[k, b] & ~pinned[b]
                assert torch.equal(s.masked[k, b], scored)
                assert torch.allclose(s.token_logps[k, b][scored], lp[scored], atol=1e-5)
                want[k, b] = lp[scored].mean() if scored.any() else 0.0
                counted += int(scored.any())
    assert counted >= 8 and torch.equal(s.t, d.t)
    assert torch.allclose(est.reduce(s), want.mean(0), atol=1e-5) and torch.allclose(elbo, want.mean(0), atol=1e-5)
    assert bool((d.scored & pinned).any())  # a pinned position was drawn: the pins did act


def test_the_samplers_log_probs_are_averaged_over_the_completion():
    est = SPGBlocksEstimator(SPGBlocksConfig(), MASK)
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -9.0, -9.0]])
    cmask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert torch.allclose(est.sampler_units(logp, cmask), torch.tensor([-2.5, -0.5]))


def test_the_masked_count_spans_its_range_and_the_draws_are_independent():
    """Over many rows, one block of 8 completion positions: with t_min = 0.5, t_max = 0.75 the masked
    count takes every value of [floor(8 * 0.5), floor(8 * 0.75)] = [4, 6] and no other; in uniform block
    choice the chosen block, the count and the first prompt position's mask come from different uniforms
    (their correlations are within sampling noise of 0)."""
    est = SPGBlocksEstimator(SPGBlocksConfig(num_samples=1, block_length=8, t_min=0.5, t_max=0.75,
                                             block_choice="uniform", p_mask_prompt=0.5), MASK)
    n = 4000
    d = est.draw(list(range(n)), torch.ones(n, 2, dtype=torch.long), torch.ones(n, 16, dtype=torch.long))
    in_first = d.block[0] == 0
    counts = ((d.scored[0, :, :8]) & in_first[:, None]).sum(-1)[in_first]  # block 0 chosen: its own count
    assert set(counts.tolist()) == {4, 5, 6}
    count = torch.where(in_first, d.scored[0, :, :8].sum(-1), d.scored[0, :, 8:].sum(-1)).float()
    block, hit = d.block[0].float(), d.prompt_hit[0, :, 0].float()
    corr = lambda a, b: float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    bound = 4 / n ** 0.5  # four standard errors of a correlation of independent draws
    assert abs(corr(block, count)) < bound and abs(corr(count, hit)) < bound and abs(corr(block, hit)) < bound


@pytest.mark.parametrize("field,value,ok", [("t_min", 1.0, True), ("t_min", 1.5, False), ("t_max", 1.5, False),
                                            ("block_length", 1, True), ("block_length", 0, False),
                                            ("block_choice", "random", False)])
def test_its_settings_are_checked_at_their_edges(field, value, ok):
    from diffusion_rl.core.errors import ConfigError

    cfg = SPGBlocksConfig(**{field: value, **({"t_max": 1.0} if field == "t_min" else {})})
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ConfigError, match=f"^likelihood\\.{field}="):
            cfg.validate()
    SPGBlocksConfig(t_min=0.3, t_max=0.3).validate()  # an interval of one point
