"""TraceRL's rounds and rows (likelihood/trace.py): which sampler steps share a training round, and each
row's masked and decoded positions, hand-computed. The objective is tested in tests/unit/rl/test_tracerl.py."""

import torch

from diffusion_rl.likelihood.trace import NO_ROUND, round_rows, row_masks, trace_rounds
from diffusion_rl.sampling.trajectory import FILLED


def test_rounds_hand_computed():
    cs = torch.tensor([[-1, 3, 0, 3, 7, 5, FILLED, 0]])  # -1: never masked (no step), FILLED: EOS fill
    r = trace_rounds(cs, segment=8, shrink=1)
    assert r.tolist() == [[NO_ROUND, 1, 0, 1, 3, 2, NO_ROUND, 0]]
    assert trace_rounds(cs, segment=8, shrink=2).tolist() == [[NO_ROUND, 0, 0, 0, 1, 1, NO_ROUND, 0]]
    # per block of 4: ranks restart in each block
    assert trace_rounds(cs, segment=4, shrink=1).tolist() == [[NO_ROUND, 1, 0, 1, 2, 1, NO_ROUND, 0]]
    sample, rnd = round_rows(trace_rounds(cs, 4, 1), torch.ones(1, 8, dtype=torch.bool))
    assert list(zip(sample.tolist(), rnd.tolist())) == [(0, 0), (0, 1), (0, 2)]
    masked, decoded = row_masks(trace_rounds(cs, 4, 1), sample, rnd)
    assert masked[1].tolist() == [True, True, False, True, True, True, True, False]
    assert decoded[1].tolist() == [False, True, False, True, False, True, False, False]


def test_rows_of_several_samples_rank_each_sample_on_its_own():
    cs = torch.tensor([[2, 0, 2, 5], [1, 1, -1, 0]])
    assert trace_rounds(cs, segment=4, shrink=1).tolist() == [[1, 0, 1, 2], [1, 1, NO_ROUND, 0]]
    assert trace_rounds(cs, segment=2, shrink=1).tolist() == [[1, 0, 0, 1], [0, 0, NO_ROUND, 0]]


def test_a_round_is_a_row_only_where_it_decodes_a_trainable_position():
    rounds = torch.tensor([[0, 1, 1, NO_ROUND], [2, 0, NO_ROUND, 1]])
    trainable = torch.tensor([[True, False, False, True], [True, True, True, False]])
    sample, rnd = round_rows(rounds, trainable)
    # sample 0: round 1 decodes only untrained positions; sample 1: round 1's position is not trainable
    assert list(zip(sample.tolist(), rnd.tolist())) == [(0, 0), (1, 0), (1, 2)]
    one = round_rows(torch.tensor([[0]]), torch.tensor([[True]]))  # one position, one row
    assert [x.tolist() for x in one] == [[0], [0]]
    empty = round_rows(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4, dtype=torch.bool))
    assert [x.shape for x in empty] == [(0,), (0,)]
    none = round_rows(torch.full((2, 3), NO_ROUND), torch.ones(2, 3, dtype=torch.bool))  # nothing committed
    assert [x.numel() for x in none] == [0, 0]


def test_block_rows_score_each_block_against_its_clean_prefix(block_bundle):
    """``block_logps`` aligns the prompt to whole blocks (left padding, masked out) and masks the row's
    positions, then scores like one forward per block (``per_block_logps``, tested equal to the
    staircase in test_staircase.py) on the prompt and the masked completion built here by hand."""
    from diffusion_rl.likelihood.staircase import per_block_logps
    from diffusion_rl.likelihood.trace import block_logps
    from diffusion_rl.models.policy import logits_fn
    from tests.helpers.blocks import BS

    fwd, mask_id = logits_fn(block_bundle.net), block_bundle.mask_token_id
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 10, (2, BS + 1), generator=g)  # not whole blocks
    pmask = torch.ones_like(prompt)
    pmask[1, :2] = 0  # the second prompt left-padded
    completion = torch.randint(0, 10, (2, 2 * BS), generator=g)
    masked = torch.rand(2, 2 * BS, generator=g) < 0.5
    masked[:, 0] = True
    select = masked.clone()
    select[0, 0] = False  # masked but not read
    pad = BS - 1  # columns to the next whole block
    aligned = torch.cat([torch.full((2, pad), mask_id), prompt], 1)
    aligned_mask = torch.cat([torch.zeros(2, pad, dtype=pmask.dtype), pmask], 1)
    noisy = torch.where(masked, torch.full_like(completion, mask_id), completion)
    with torch.no_grad():
        got = block_logps(fwd, prompt, pmask, completion, masked, select, mask_id, BS)
        ref = per_block_logps(fwd, aligned, aligned_mask, completion, noisy, BS, select=select)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert (got[select] < 0).all() and (got[~select] == 0).all()
    with torch.no_grad():  # the masking matters: scored on the clean completion the numbers differ
        clean = per_block_logps(fwd, aligned, aligned_mask, completion, completion, BS, select=select)
    assert not torch.allclose(got[select], clean[select], atol=1e-3)
