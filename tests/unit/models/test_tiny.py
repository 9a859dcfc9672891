"""The embedded model's rotary positions: one complex multiply equals the rotation written out."""

import math

import torch

from diffusion_rl.models.tiny import TinyConfig, TinyDiffusionLM, rotary, rotary_table


def rotate_pairs(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Channel pair ``(2j, 2j + 1)`` of row ``b``, position ``l`` rotated by ``pos[b, l] * base^(-2j/D)``,
    one pair at a time."""
    B, H, L, D = x.shape
    out = torch.empty_like(x)
    for b in range(B):
        for i in range(L):
            for j in range(D // 2):
                a = float(pos[b, i]) * base ** (-2 * j / D)
                c, s = math.cos(a), math.sin(a)
                x1, x2 = x[b, :, i, 2 * j], x[b, :, i, 2 * j + 1]
                out[b, :, i, 2 * j] = x1 * c - x2 * s
                out[b, :, i, 2 * j + 1] = x1 * s + x2 * c
    return out


def test_rotary_is_the_pairwise_rotation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 7, 9, 30, 100]])
    got = rotary(x, rotary_table(pos, 8, 10000.0))
    torch.testing.assert_close(got, rotate_pairs(x, pos, 10000.0), atol=1e-6, rtol=0)


def test_rotary_moves_queries_by_position_only():
    """A dot product of rotated vectors depends on the positions' difference (what rotary is for)."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    dot = lambda i, j: float((rotary(q, rotary_table(torch.tensor([[i]]), 16, 100.0))  # noqa: E731
                              * rotary(k, rotary_table(torch.tensor([[j]]), 16, 100.0))).sum())
    assert math.isclose(dot(3, 1), dot(12, 10), rel_tol=1e-5)
    assert not math.isclose(dot(3, 1), dot(3, 2), rel_tol=1e-3)


def test_forward_keeps_its_outputs_with_a_cache():
    """The table is built per forward from the new tokens' positions: a cached forward of the last
    tokens equals the full forward there (block-causal model, where the cache is exact)."""
    torch.manual_seed(0)
    net = TinyDiffusionLM(TinyConfig(vocab_size=20, d_model=32, n_layers=2, n_heads=2, block_size=4)).eval()
    ids = torch.randint(0, 20, (2, 12))
    full = net(input_ids=ids).logits
    past = net(input_ids=ids[:, :8], use_cache=True).past_key_values
    tail = net(input_ids=ids[:, 8:], past_key_values=past).logits
    torch.testing.assert_close(tail, full[:, 8:], atol=1e-5, rtol=1e-5)
