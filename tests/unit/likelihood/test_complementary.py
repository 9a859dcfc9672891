"""Coupled-GRPO's complementary-mask estimator (likelihood/complementary.py): parity with a
transcription of DiffuCoder's masking and per-token log-probs (apple/ml-diffucoder @ f735e01,
``src/open_r1/coupled_grpo.py``) on a random model, hand-checked invariants. The objective's loss is
tested in tests/unit/rl/test_coupled_grpo.py, which reuses this transcription."""

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.likelihood.complementary import (
    ComplementaryConfig,
    ComplementaryEstimator,
    coupled_token_logps,
)
from tests.helpers.random_model import MASK, ContextModel, V, forward_spy, random_batch

# ---------------------------------------------------------------- the transcription (reference)
# DiffuCoder's computation written out afresh: forward_process with its random draws passed in
# (mask_ratio, random_matrix), selective_log_softmax for one iteration. Shapes as there.


def ref_forward_process(batch, prompt_index, mask_id, mask_ratio, random_matrix):
    b = batch.shape[0]
    noisy_batch = []
    t_p = torch.ones(b) * mask_ratio
    is_mask = ~prompt_index
    noisy_batch.append(torch.where(is_mask, mask_id, batch))
    is_mask = ~prompt_index & (random_matrix < t_p.unsqueeze(1))
    completion_mask = is_mask
    noisy_batch.append(torch.where(is_mask, mask_id, batch))
    is_mask = ~prompt_index & (random_matrix > t_p.unsqueeze(1))
    noisy_batch.append(torch.where(is_mask, mask_id, batch))
    return noisy_batch, [1, 1 / mask_ratio, 1 / (1 - mask_ratio)], completion_mask


def ref_selective_log_softmax(logits, index, weights, mask):
    full_batch_size = logits.size(0) // 3
    num_iterations = weights.size(0) // 3
    batch_size = full_batch_size // num_iterations
    out = []
    for i in range(full_batch_size):
        seq_labels = index[i]
        chunk, offset = divmod(i, batch_size)
        base = chunk * 3 * batch_size
        rows = torch.tensor([base + offset, base + batch_size + offset, base + 2 * batch_size + offset])
        seq_logps = F.log_softmax(logits[rows], dim=-1)
        per_tok = seq_logps.gather(dim=-1, index=seq_labels.unsqueeze(0).unsqueeze(-1).expand(3, -1, 1)).squeeze(-1)
        w = weights[(i // batch_size) * 3:(i // batch_size + 1) * 3]
        weighted = torch.where(mask[i], per_tok[1] * w[1], per_tok[2] * w[2])
        out.append((per_tok[0] + weighted) / 2)
    return torch.stack(out)


def ref_per_token_logps(model, input_ids, logits_to_keep, mask_ratio, random_matrix, mask_id):
    """``_get_per_token_logps`` for one iteration: (B, T) -> (B, L)."""
    seq_len = input_ids.shape[1]
    prompt_index = torch.zeros(seq_len, dtype=torch.bool)
    prompt_index[: seq_len - logits_to_keep] = True
    noisy, weights, completion_mask = ref_forward_process(input_ids, prompt_index, mask_id, mask_ratio, random_matrix)
    logits = model(torch.cat(noisy, dim=0))
    completion_logits = logits[:, -logits_to_keep:, :]
    targets = input_ids[:, -logits_to_keep:]
    loss_mask = completion_mask[:, -logits_to_keep:]
    return ref_selective_log_softmax(completion_logits, targets, torch.tensor(weights), loss_mask)


def drawn_inputs(est, seeds, prompt_mask, L):
    """Our draw, handed to the transcription: its mask_ratio (one per batch) and random_matrix."""
    d = est.draw(seeds, prompt_mask, L)
    assert bool((d.t == d.t[0]).all())  # t_per=batch: one t for the whole batch, as the public code
    rm = torch.cat([torch.full_like(prompt_mask, 0.5, dtype=torch.float), d.u], 1)  # the prompt part is unused
    return float(d.t[0]), rm


# ---------------------------------------------------------------- parity


def test_estimator_matches_the_transcription_on_a_random_model():
    prompt, pmask, comp, cmask = random_batch()
    model = ContextModel(prompt.shape[1] + comp.shape[1])
    est = ComplementaryEstimator(ComplementaryConfig(), MASK)
    seeds = mask_seeds(5, 3, comp.shape[0], 1)
    ours = est(model, prompt, pmask, comp, cmask, seeds)
    t, rm = drawn_inputs(est, seeds, pmask, comp.shape[1])
    ref = ref_per_token_logps(lambda ids: model(ids), torch.cat([prompt, comp], 1), comp.shape[1], t, rm, MASK)
    assert torch.allclose(ours, ref, atol=1e-6, rtol=1e-6)  # float32 rounding of values up to ~15 nats
    g_ours = torch.autograd.grad(ours.sum(), list(model.parameters()))
    g_ref = torch.autograd.grad(ref.sum(), list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_ours, g_ref))


# ---------------------------------------------------------------- invariants


def test_coupled_token_logps_hand_computed():
    full = torch.tensor([[-1.0, -2.0, -3.0]])
    half_lp = torch.tensor([[-0.5, 0.0, -1.5]])  # read where half
    comp_lp = torch.tensor([[0.0, -4.0, 0.0]])  # read elsewhere
    half = torch.tensor([[True, False, True]])
    t = torch.tensor([0.25])
    out = coupled_token_logps(full, half_lp, comp_lp, half, t)
    expected = torch.tensor([[(-1 - 0.5 / 0.25) / 2, (-2 - 4 / 0.75) / 2, (-3 - 1.5 / 0.25) / 2]])
    assert torch.allclose(out, expected)


@pytest.mark.parametrize("t_per", ["batch", "sample"])
def test_every_token_is_scored_exactly_once_per_pair(t_per):
    prompt, pmask, comp, cmask = random_batch(B=8, L=16)
    fwd, seen = forward_spy(ContextModel(20))
    est = ComplementaryEstimator(ComplementaryConfig(t_per=t_per), MASK)
    for it in range(3):
        seen.clear()
        est(fwd, prompt, pmask, comp, cmask, mask_seeds(0, 1, 8, it))
        assert len(seen) == 1  # one forward over the three copies
        full, half, compl = (seen[0].view(3, 8, -1)[:, :, 4:] == MASK).unbind(0)
        assert bool(full.all())
        assert bool((half ^ compl).all())  # each token masked in exactly one of the pair
        assert bool(half.any()) and bool(compl.any())
        assert torch.equal(seen[0].view(3, 8, -1)[:, :, :4], prompt.expand(3, -1, -1))  # the prompt stays clean


def test_one_t_per_batch_shared_by_old_and_new_and_fresh_with_the_iteration():
    pmask = torch.ones(8, 3, dtype=torch.long)
    est = ComplementaryEstimator(ComplementaryConfig(), MASK)
    d0 = est.draw(mask_seeds(0, 1, 8, 0), pmask, 10)
    assert bool((d0.t == d0.t[0]).all()) and 0.2 <= float(d0.t[0]) <= 0.8
    again = est.draw(mask_seeds(0, 1, 8, 0), pmask, 10)
    assert torch.equal(again.t, d0.t) and torch.equal(again.u, d0.u)  # the same seeds: the same masks
    ts = {float(est.draw(mask_seeds(0, r, 8, it), pmask, 10).t[0]) for r in range(3) for it in range(3)}
    assert len(ts) == 9 and min(ts) >= 0.2 and max(ts) <= 0.8
    rows = est.draw(mask_seeds(0, 1, 8, 0), pmask, 10).u
    assert not torch.equal(rows[0], rows[1])  # the per-token uniforms are per row
    per_row = ComplementaryEstimator(ComplementaryConfig(t_per="sample"), MASK).draw(mask_seeds(0, 1, 8, 0), pmask, 10)
    assert len(set(per_row.t.tolist())) == 8 and torch.equal(per_row.u, d0.u)  # only t changes


def test_a_context_free_model_gives_the_weights_exactly():
    """With logits that ignore the input, every copy gives the same c_i = log p(x_i), so the estimate is
    1/2 (c_i + c_i / t) where the half copy masks i and 1/2 (c_i + c_i / (1 - t)) elsewhere."""
    prompt, pmask, comp, cmask = random_batch()
    table = torch.randn(prompt.shape[1] + comp.shape[1], V)

    def fwd(ids, attn, position_ids=None):
        return table[: ids.shape[1]].expand(ids.shape[0], -1, -1)

    est = ComplementaryEstimator(ComplementaryConfig(t_min=0.3, t_max=0.3), MASK)
    seeds = mask_seeds(1, 2, comp.shape[0], 0)
    out = est(fwd, prompt, pmask, comp, cmask, seeds)
    c = torch.log_softmax(table[prompt.shape[1]:], -1).gather(-1, comp.T).T  # (B, L)
    half = est.draw(seeds, pmask, comp.shape[1]).half
    assert torch.allclose(out, torch.where(half, (c + c / 0.3) / 2, (c + c / 0.7) / 2), atol=1e-6)


def test_prompt_masking_is_shared_by_the_three_copies():
    prompt, pmask, comp, cmask = random_batch(B=8)
    fwd, seen = forward_spy(ContextModel(11))
    est = ComplementaryEstimator(ComplementaryConfig(p_mask_prompt=0.5), MASK)
    est(fwd, prompt, pmask, comp, cmask, mask_seeds(0, 1, 8, 0))
    p = seen[0].view(3, 8, -1)[:, :, :4] == MASK
    assert bool(p.any()) and torch.equal(p[0], p[1]) and torch.equal(p[0], p[2])


@pytest.mark.parametrize("t_per", ["batch", "sample"])
def test_the_three_copies_written_out_row_by_row(tiny_bundle, t_per):
    """Each row's three copies built by hand from the draw (every token masked; those with u < t; the
    others), each a forward of that row alone with its own attention mask, combined by DiffuCoder's
    weights: a left-padded prompt (its padding unseen), masked prompt tokens, pinned tokens shown in every
    copy and scored in none."""
    from diffusion_rl.models.policy import logits_fn

    net, mask = tiny_bundle.net.eval(), tiny_bundle.mask_token_id
    g = torch.Generator().manual_seed(4)
    prompt, comp = torch.randint(3, 30, (3, 5), generator=g), torch.randint(3, 30, (3, 6), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[2, :2] = 0
    pinned = torch.zeros_like(comp, dtype=torch.bool)
    pinned[1, [0, 4]] = True
    est = ComplementaryEstimator(ComplementaryConfig(p_mask_prompt=0.4, t_per=t_per), mask)
    fwd, seeds = logits_fn(net), [21, 22, 23]
    with torch.no_grad():
        got = est(fwd, prompt, pmask, comp, torch.ones_like(comp), seeds, pinned)
        d = est.draw(seeds, pmask, 6)
        for b in range(3):
            ids_p = torch.where(d.prompt_hit[b], mask, prompt[b])
            attn = torch.cat([pmask[b], torch.ones(6, dtype=pmask.dtype)])[None]
            lp = []
            for hide in (torch.ones(6, dtype=torch.bool), d.half[b], ~d.half[b]):
                ids_c = torch.where(hide & ~pinned[b], mask, comp[b])
                logp = fwd(torch.cat([ids_p, ids_c])[None], attn)[0, 5:].float().log_softmax(-1)
                lp.append(logp.gather(-1, comp[b, :, None])[:, 0])
            t = float(d.t[b])
            want = 0.5 * (lp[0] + torch.where(d.half[b], lp[1] / t, lp[2] / (1 - t)))
            want = torch.where(pinned[b], 0.0, want)
            assert torch.allclose(got[b], want, atol=1e-5), b
    assert bool(d.prompt_hit.any()) and bool(d.half.any()) and bool((~d.half).any())


def test_t_and_the_prompt_mask_come_from_different_uniforms():
    """t_per=sample: each row's t and its first prompt position's mask are uncorrelated over many rows."""
    est = ComplementaryEstimator(ComplementaryConfig(p_mask_prompt=0.5, t_per="sample"), MASK)
    n = 4000
    d = est.draw(list(range(n)), torch.ones(n, 3, dtype=torch.long), 4)
    corr = float(torch.corrcoef(torch.stack([d.t.float(), d.prompt_hit[:, 0].float()]))[0, 1])
    assert abs(corr) < 4 / n ** 0.5


@pytest.mark.parametrize("field,value,ok", [("t_min", 0.0, False), ("t_min", 1.0, False), ("t_min", 1.5, False),
                                            ("t_max", 1.0, False), ("t_max", 1.5, False), ("t_per", "row", False),
                                            ("t_min", 0.5, True)])
def test_its_settings_are_checked_at_their_edges(field, value, ok):
    from diffusion_rl.core.errors import ConfigError

    cfg = ComplementaryConfig(**{field: value, **({"t_max": max(value, 0.5)} if field == "t_min" and value < 1 else {})})
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ConfigError, match=f"^likelihood\\.{field}="):
            cfg.validate()
