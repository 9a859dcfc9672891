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
