"""EGSPO's stepwise likelihood (likelihood/stepwise.py) on hand-computed log-probabilities: the sum, the
mean and the per-token terms over the positions committed at a step, from the state before it."""

import math

import pytest
import torch

from diffusion_rl.likelihood.stepwise import stepwise_logps

V = 3


def forward(ids, attn=None):
    """Logits that depend on the token at each position and, where given, on the attention mask."""
    logits = torch.nn.functional.one_hot(ids, V).float() * 2.0  # (N, T, V)
    return logits if attn is None else logits + attn[..., None].float() * torch.tensor([0.0, 1.0, 0.0])


def logp(token, state_token, attended=True):
    row = [2.0 * (v == state_token) + (1.0 if attended and v == 1 else 0.0) for v in range(V)]
    return row[token] - math.log(sum(math.exp(x) for x in row))


STATES = torch.tensor([[0, 2, 2, 1], [1, 0, 0, 2], [2, 2, 2, 2]])
TOKENS = torch.tensor([[0, 1, 0, 1], [1, 2, 2, 0], [0, 0, 0, 0]])
COMMITTED = torch.tensor([[False, True, True, False], [True, False, False, False], [False] * 4])
ATTN = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]])


def test_sum_mean_and_token_terms_hand_computed():
    row0 = [logp(1, 2), logp(0, 2)]  # positions 1 and 2 of row 0
    row1 = [logp(1, 1, attended=False)]  # position 0 of row 1 is padding: not attended
    s = stepwise_logps(forward, STATES, ATTN, COMMITTED, TOKENS)  # reduce="sum" by default
    assert s.tolist() == pytest.approx([sum(row0), sum(row1), 0.0], abs=1e-6)
    m = stepwise_logps(forward, STATES, ATTN, COMMITTED, TOKENS, reduce="mean")
    assert m.tolist() == pytest.approx([sum(row0) / 2, row1[0], 0.0], abs=1e-6)  # a step with nothing is 0
    t = stepwise_logps(forward, STATES, ATTN, COMMITTED, TOKENS, reduce="token")
    assert t.shape == (3, 4)
    assert t[0].tolist() == pytest.approx([0.0, row0[0], row0[1], 0.0], abs=1e-6)
    assert t[1].tolist() == pytest.approx([row1[0], 0, 0, 0], abs=1e-6) and (t[2] == 0).all()


def test_without_an_attention_mask_every_position_is_attended():
    s = stepwise_logps(forward, STATES, None, COMMITTED, TOKENS)
    assert s[1].item() == pytest.approx(logp(1, 1, attended=False))  # no mask: the forward sees none
    assert s[0].item() == pytest.approx(logp(1, 2, attended=False) + logp(0, 2, attended=False))


def test_an_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="reduce='max': allowed sum, mean, token"):
        stepwise_logps(forward, STATES, ATTN, COMMITTED, TOKENS, reduce="max")
    for ok in ("sum", "mean", "token"):
        stepwise_logps(forward, STATES, ATTN, COMMITTED, TOKENS, reduce=ok)
