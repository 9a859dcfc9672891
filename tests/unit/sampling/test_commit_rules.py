"""The sampler's commit rules and its per-row statistics against hand-computed values: how many
candidates ``decode=threshold|factor`` commits (docs/methods.md §10), which of equally confident
positions go first, the commit counts of a block, the tail ``stop_after_eos`` fills, the attention
mask of a padded prompt, and the entropy, commit count and log-probability every sample reports."""

import math

import pytest
import torch

from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.sampler import (
    CommitStats,
    block_schedule,
    completion_attention,
    fill_after,
    parallel_count,
    top_k_per_row,
)


def test_threshold_commits_the_candidates_strictly_above_it_and_at_least_one():
    conf = torch.tensor([[0.9, 0.5, 0.5, 0.95],  # two above 0.5; the two at 0.5 are not above it
                         [0.2, 0.3, 0.1, 0.4],  # none above: the most confident one still
                         [0.99, 0.98, 0.2, 0.1],  # the two above are not allowed: one
                         [0.9, 0.9, 0.9, 0.9]])  # nothing allowed: none
    allowed = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    n = parallel_count(conf, allowed, SamplerConfig(decode="threshold", threshold=0.5))
    assert n.tolist() == [2, 1, 1, 0]


def test_factor_commits_the_first_n_sorted_while_c_n_is_at_least_one_minus_factor_over_n_plus_one():
    # factor 2: the n-th largest must be >= 1 - 2 / (n + 1) = 0, 1/3, 1/2, 3/5, 2/3, ...
    conf = torch.tensor([[0.1, 0.9, 0.5, 0.8],  # sorted 0.9, 0.8, 0.5 (= 1/2 at n = 3), 0.1 < 3/5: three
                         [0.3, 0.9, 0.2, 0.25],  # sorted 0.9, 0.3 < 1/3: one
                         [0.9, 0.85, 0.8, 0.7]])  # all four pass (0.7 >= 3/5)
    allowed = torch.ones(3, 4, dtype=torch.bool)
    n = parallel_count(conf, allowed, SamplerConfig(decode="factor", factor=2.0))
    assert n.tolist() == [3, 1, 4]
    # a position that may not be committed is not counted however confident it is
    allowed[2, 0] = allowed[2, 1] = False
    assert parallel_count(conf, allowed, SamplerConfig(decode="factor", factor=2.0)).tolist() == [3, 1, 2]
    # factor 1: 1/2, 2/3, 3/4: 0.9 and 0.8 pass, 0.5 < 3/4 does not
    assert parallel_count(conf[:1], allowed[:1], SamplerConfig(decode="factor", factor=1.0)).tolist() == [2]


def test_top_k_per_row_breaks_ties_by_position_the_earlier_first():
    conf = torch.zeros(2, 64)
    conf[:, ::3] = 1.0  # 22 positions tied at 1, 42 tied at 0
    k = torch.tensor([5, 30])
    chosen = top_k_per_row(conf, k)
    assert chosen[0].nonzero()[:, 0].tolist() == [0, 3, 6, 9, 12]
    expected = list(range(0, 64, 3)) + [p for p in range(64) if p % 3][:8]
    assert chosen[1].nonzero()[:, 0].tolist() == sorted(expected)
    assert chosen.sum(-1).tolist() == [5, 30]


def test_a_fixed_block_schedule_spreads_the_masked_positions_of_the_live_rows():
    M = 9
    block = torch.tensor([[M, 1, M, M], [M, M, M, M], [2, 3, 4, 5]])
    counts = torch.stack(list(block_schedule(SamplerConfig(), block, M, 2)), 1)  # (B, steps)
    assert counts.tolist() == [[2, 1], [2, 2], [0, 0]]
    live = torch.tensor([True, False, True])
    counts = torch.stack(list(block_schedule(SamplerConfig(), block, M, 3, live)), 1)
    assert counts.tolist() == [[1, 1, 1], [0, 0, 0], [0, 0, 0]]


def test_a_parallel_block_schedule_asks_until_no_live_row_has_a_masked_position():
    M = 9
    block = torch.tensor([[M, 1, M, M], [M, 2, 3, 4]])
    steps = block_schedule(SamplerConfig(decode="threshold", threshold=0.5), block, M, 0)
    assert next(steps) is None
    block[0, 0] = block[1, 0] = 5  # committed in place: the schedule reads the view
    assert next(steps) is None  # row 0 still has two
    block[0, 2:] = 6
    assert next(steps, "done") == "done"
    # at most as many steps as the largest masked count at the start, even if nothing is committed
    block = torch.tensor([[M, M, 1, 1]])
    assert list(block_schedule(SamplerConfig(decode="factor", factor=1.0), block, M, 0)) == [None, None]


def test_fill_after_sets_the_masked_positions_from_each_row_s_end_to_eos_only():
    M, E = 9, 8
    x = torch.tensor([[1, M, 2, M, M, M],
                      [1, 2, M, 3, M, M],
                      [M, M, M, M, M, M]])
    ended_at = torch.tensor([3, 2, 6])  # row 2 has not ended
    stats = CommitStats(3, 6, torch.device("cpu"))
    out = fill_after(x, ended_at, E, M, stats, None)
    assert out.tolist() == [[1, M, 2, E, E, E], [1, 2, E, 3, E, E], [M, M, M, M, M, M]]
    assert math.isclose(stats.filled, (3 + 3 + 0) / 3)


def test_the_attention_mask_of_a_padded_prompt_covers_the_completion():
    assert completion_attention(None, 3) is None
    assert completion_attention(torch.ones(2, 4, dtype=torch.long), 3) is None  # no padding: attend everywhere
    pm = torch.tensor([[0, 1, 1], [1, 1, 1]])
    attn = completion_attention(pm, 2)
    assert attn.dtype == torch.long
    assert attn.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_every_sample_reports_the_entropy_count_and_log_prob_of_what_it_committed():
    """A model whose logits depend on the position only: every committed token's entropy and log-prob
    are known whatever step committed it."""
    V, M, P, L = 6, 5, 2, 6
    g = torch.Generator().manual_seed(3)
    table = torch.randn(P + L, V, generator=g) * 2  # (T, V)
    table[:, M] = -1e9

    def fwd(ids, attn):
        return table.expand(ids.shape[0], -1, -1)

    ids = torch.tensor([[1, 2], [3, 4]])
    for temperature in (0.0, 0.9):
        cfg = SamplerConfig(gen_length=L, block_length=3, steps=4, temperature=temperature)
        out = generate(fwd, ids, None, cfg, M, RowNoise([7, 8]))
        logp = table[P:].log_softmax(-1)  # (L, V)
        ent = -(logp.exp() * logp).sum(-1)  # (L,)
        assert torch.allclose(out.entropy_sum, ent.double().sum().expand(2), atol=1e-5)
        assert out.num_committed.tolist() == [L, L]
        expected = logp.gather(-1, out.completion.T).T  # (2, L) each committed token's temperature-1 log-prob
        assert torch.allclose(out.token_logp, expected, atol=1e-6)
        assert out.steps == 4 and out.forwards == 4 and out.forward_tokens == 4 * (P + L)


def test_commit_stats_accumulate_over_steps_at_their_offsets():
    stats = CommitStats(2, 5, torch.device("cpu"))
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]], [[0.25, 0.75], [0.5, 0.5]]]))  # (B=2, R=2, V=2)
    stats.add(logits, torch.tensor([[True, False], [True, True]]), torch.tensor([[0, 0], [1, 1]]), offset=1)
    stats.add(logits, torch.tensor([[False, True], [False, False]]), torch.tensor([[0, 1], [0, 0]]), offset=3)
    h = lambda *p: -sum(q * math.log(q) for q in p)  # noqa: E731
    assert stats.count.tolist() == [2, 2]
    assert torch.allclose(stats.entropy_sum, torch.tensor([h(0.5, 0.5) + h(0.9, 0.1), h(0.25, 0.75) + h(0.5, 0.5)],
                                                          dtype=torch.float64))
    expected = torch.tensor([[0, math.log(0.5), 0, 0, math.log(0.1)], [0, math.log(0.75), math.log(0.5), 0, 0]])
    assert torch.allclose(stats.token_logp, expected)
    assert stats.steps == 2
    stats.forward(7, passes=2)
    assert (stats.forwards, stats.forward_tokens) == (2, 14)


def test_an_edit_replaces_the_log_prob_at_its_place_and_counts_per_row():
    stats = CommitStats(2, 4, torch.device("cpu"))
    stats.token_logp.fill_(-9.0)
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.2, 0.8]], [[0.9, 0.1], [0.3, 0.7]]]))  # (B=2, R=2, V=2)
    edit = torch.tensor([[False, True], [True, True]])
    stats.edit(logits, edit, torch.tensor([[0, 1], [0, 0]]), offset=2)
    expected = torch.tensor([[-9.0, -9.0, -9.0, math.log(0.8)], [-9.0, -9.0, math.log(0.9), math.log(0.3)]])
    assert torch.allclose(stats.token_logp, expected)
    assert stats.edited == pytest.approx(3 / 2)  # replacements per row
    stats.edit(logits, torch.tensor([[True, False], [False, False]]), torch.zeros(2, 2, dtype=torch.long), offset=0)
    assert stats.edited == pytest.approx(3 / 2 + 1 / 2)  # accumulated over the passes
    out = stats.finish(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    assert out.edited == pytest.approx(2.0) and out.token_logp.shape == (2, 3)


def test_fresh_commit_stats_and_their_defaults():
    stats = CommitStats(3, 5, torch.device("cpu"))
    out = stats.finish(torch.zeros(3, 5, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))
    assert (out.filled, out.edited, out.forwards, out.forward_tokens, out.steps) == (0.0, 0.0, 0, 0, 0)
    assert out.num_committed.dtype == torch.long and out.token_logp.dtype == torch.float32
    stats.forward(7)  # one pass unless told
    assert (stats.forwards, stats.forward_tokens) == (1, 7)
    logits = torch.zeros(3, 2, 4)
    stats.add(logits, torch.tensor([[True, False]] * 3), torch.zeros(3, 2, dtype=torch.long))  # offset 0
    assert torch.allclose(stats.token_logp[:, 0], torch.full((3,), math.log(0.25)))
    assert (stats.token_logp[:, 1:] == 0).all()


def test_gumbel_dtype_follows_the_config():
    from diffusion_rl.sampling.sampler import gumbel_dtype

    assert gumbel_dtype(SamplerConfig()) == torch.float64  # LLaDA's
    assert gumbel_dtype(SamplerConfig(gumbel_dtype="float32")) == torch.float32


def test_eos_factor_is_linear_over_the_steps_and_held_after_the_last():
    from diffusion_rl.sampling.sampler import eos_factor

    cfg = SamplerConfig(steps=5, eos_gamma_min=0.01, eos_gamma_max=1.0)
    assert [eos_factor(cfg, s) for s in range(5)] == pytest.approx([0.01 + 0.99 * s / 4 for s in range(5)])
    assert eos_factor(cfg, 9) == pytest.approx(1.0) and eos_factor(cfg, -3) == pytest.approx(0.01)
    assert eos_factor(SamplerConfig(steps=1, eos_gamma_min=0.01, eos_gamma_max=0.5), 0) == 0.5


def test_ass_steps_and_maskgit_counts_against_the_public_formulas():
    from diffusion_rl.sampling.sampler import ass_steps, maskgit_transfer_tokens

    assert [ass_steps(n) for n in (1, 2, 3, 8, 256, 257)] == [0, 1, 1, 3, 8, 8]  # int(log2 n)
    for m, steps in ((10, 10), (7, 3), (29, 7), (256, 64)):
        # get_num_transfer_tokens_maskgit, in Python floats (float64): committed by step t is m - floor(m * ratio_t)
        done = [m - math.floor(m * max(1 - (t + 1) / steps, 1e-6)) for t in range(steps)]
        expected = [done[0]] + [done[t] - done[t - 1] for t in range(1, steps)]
        assert maskgit_transfer_tokens(torch.tensor([m]), steps)[0].tolist() == expected, (m, steps)


def test_an_inactive_row_draws_no_noise_in_a_step():
    from diffusion_rl.sampling.sampler import denoise_step

    cfg = SamplerConfig(temperature=0.9)
    noise = RowNoise([5, 9])
    allowed = torch.tensor([[True, True, False], [False, False, False]])  # row 1 has nothing to commit
    denoise_step(torch.zeros(2, 3, 4), allowed, torch.tensor([1, 0]), cfg, noise, torch.float64)
    after = torch.rand(3, generator=noise.generators(torch.device("cpu"))[1], dtype=torch.float64)
    assert torch.equal(after, torch.rand(3, generator=torch.Generator().manual_seed(9), dtype=torch.float64))


def test_an_eos_in_the_prompt_does_not_end_a_row():
    """A chat prompt holds the EOS token (``<|eot_id|>`` ends its turns): ``stop_after_eos`` reads the
    completion only, also when a schedule continues in a later block."""
    V, eos, m = 12, 11, 10

    def fwd(ids, attn):
        logits = torch.zeros(ids.shape[0], ids.shape[1], V)
        logits[:, :, 7] = 5.0 + 0.01 * torch.arange(ids.shape[1])
        logits[..., m] = -1e9
        return logits

    ids = torch.tensor([[eos, 3], [3, eos]])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=0.0, stop_after_eos=True)
    out = generate(fwd, ids, None, cfg, m, eos_id=eos)
    assert (out.completion == 7).all() and out.filled == 0 and out.forwards == 4
    part = generate(fwd, ids, None, cfg, m, eos_id=eos, stop_step=2)
    rest = generate(fwd, ids, None, cfg, m, eos_id=eos, canvas=part.completion, start_step=2)
    assert torch.equal(rest.completion, out.completion) and rest.forwards == 2


def test_an_empty_batch_has_no_steps_and_fills_nothing():
    M, E = 9, 8
    empty = torch.zeros(0, 4, dtype=torch.long)
    assert list(block_schedule(SamplerConfig(decode="threshold"), empty, M, 0)) == []
    stats = CommitStats(0, 4, torch.device("cpu"))
    fill_after(empty, torch.zeros(0, dtype=torch.long), E, M, stats, None)
    assert stats.filled == 0.0
