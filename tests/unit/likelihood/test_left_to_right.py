"""JustGRPO's exact left-to-right log-probs (likelihood/left_to_right.py): why each position needs its own
input. That they equal the sampler's own log-probs is tested with the objective, in
tests/unit/rl/test_justgrpo.py."""

import pytest
import torch

from diffusion_rl.likelihood.left_to_right import left_to_right_logps
from diffusion_rl.models.policy import encode_prompts, logits_fn


def test_no_single_forward_gives_every_positions_conditional(tiny_bundle):
    """Why one input per position: in the bidirectional model the logits at ``t`` change when a later
    token is revealed, so ``[prompt | x | MASK]`` read at every position is not the left-to-right policy."""
    b = tiny_bundle
    ids, pmask = encode_prompts(b.tokenizer, ["1203="])
    comp = torch.tensor([[5, 6, 7, 8]])
    lp = left_to_right_logps(logits_fn(b.net.eval()), ids, pmask, comp, torch.ones_like(comp, dtype=torch.bool),
                             b.mask_token_id)  # (1, 4)
    one = logits_fn(b.net)(torch.cat([ids, comp.masked_fill(torch.tensor([[False, True, True, True]]), b.mask_token_id)],
                                     1), None)  # position 1 masked, position 0 revealed: x_1's exact input
    exact_1 = one[0, ids.shape[1] + 1].log_softmax(-1)[6]
    teacher = logits_fn(b.net)(torch.cat([ids, comp.masked_fill(torch.tensor([[False, True, False, False]]),
                                                                b.mask_token_id)], 1), None)  # later tokens shown
    assert exact_1.item() == pytest.approx(lp[0, 1].item(), abs=1e-6)
    assert abs(teacher[0, ids.shape[1] + 1].log_softmax(-1)[6].item() - lp[0, 1].item()) > 1e-4
