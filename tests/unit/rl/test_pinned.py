"""A task's pinned completion tokens (``Task.pinned_completion``; Sudoku's givens): they start in the
sampler's canvas and are never masked, sampled or scored -- by the sampler, every likelihood
estimator, the rollout's scored mask, the warm start and evaluation."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood import LIKELIHOODS
from diffusion_rl.likelihood.base import mask_seeds
from diffusion_rl.models.policy import encode_prompts, logits_fn
from diffusion_rl.rl.rollout import RolloutEngine
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.tasks.sudoku import SudokuConfig, SudokuTask
from diffusion_rl.training.warmstart import masked_diffusion_loss
from tests.helpers.common import compose_cfg

ITEMS = [{"puzzle": "3102200002100320", "solution": "3142243142131324"},
         {"puzzle": "0000341221434321", "solution": "1234341221434321"}]


def canvas_of(tiny_bundle, items=ITEMS, pin=True):
    task = SudokuTask(SudokuConfig(pin_givens=pin))
    return task, task.canvas(items, tiny_bundle.tokenizer, 16, tiny_bundle.mask_token_id)


def test_sudoku_pins_its_givens_one_token_each(tiny_bundle):
    task, canvas = canvas_of(tiny_bundle)
    tok, m = tiny_bundle.tokenizer, tiny_bundle.mask_token_id
    for row, item in zip(canvas, ITEMS):
        assert [tok.decode([t]) if t != m else "0" for t in row.tolist()] == list(item["puzzle"])
    assert canvas_of(tiny_bundle, pin=False)[1] is None  # the d1 formulation: nothing pinned

    class TwoTokens(SudokuTask):
        def pinned_completion(self, item):
            return ["12"] + [None] * 15

    with pytest.raises(ConfigError, match="tokenizer makes 2 tokens"):
        TwoTokens(SudokuConfig()).canvas(ITEMS, tok, 16, m)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_never_touches_a_pinned_token(tiny_bundle, temperature):
    _, canvas = canvas_of(tiny_bundle)
    ids, mask = encode_prompts(tiny_bundle.tokenizer, [f"{it['puzzle']}=" for it in ITEMS])
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=4, temperature=temperature)
    rec = TrajectoryRecorder(tiny_bundle.mask_token_id)
    out = generate(logits_fn(tiny_bundle.net.eval()), ids, mask, cfg, tiny_bundle.mask_token_id,
                   RowNoise.rows(0, 0, ids.shape[0]), rec, canvas=canvas)
    pinned = canvas != tiny_bundle.mask_token_id
    assert torch.equal(out.completion[pinned], canvas[pinned])  # the givens, as given
    assert (out.completion[~pinned] != tiny_bundle.mask_token_id).all()  # every free cell decoded
    P = ids.shape[1]
    assert (rec.commit_step[:, P:][pinned] == -1).all()  # never masked, so never committed
    assert torch.equal(out.num_committed, (~pinned).sum(-1))  # commits are the free cells only


def _spy(forward, seen):
    def spy(ids, attn, position_ids=None, keep=None):
        seen.append(ids.clone())
        return forward(ids, attn) if position_ids is None else forward(ids, attn, position_ids)
    return spy


@pytest.mark.parametrize("name", ["one_step", "elbo", "spg_blocks", "complementary", "stratified", "even_counts"])
def test_every_estimator_shows_pinned_tokens_and_never_scores_them(tiny_bundle, name):
    """The network sees each pinned token at its position in every noisy copy, and the estimate (and
    its gradient) does not depend on the log-probability the model gives a pinned token."""
    cls = LIKELIHOODS.get(name)
    est = cls(cls.config_class(), tiny_bundle.mask_token_id)
    _, canvas = canvas_of(tiny_bundle)
    pinned = canvas != tiny_bundle.mask_token_id
    comp = torch.tensor([[ord(c) - ord("0") + 3 for c in it["solution"]] for it in ITEMS])  # (2, 16) any tokens
    comp = torch.where(pinned, canvas, comp)
    prompt, pmask = encode_prompts(tiny_bundle.tokenizer, [f"{it['puzzle']}=" for it in ITEMS])
    scored = (~pinned).float()
    seen: list[torch.Tensor] = []
    net = tiny_bundle.net.float()
    out = est(_spy(logits_fn(net), seen), prompt, pmask, comp, scored, mask_seeds(0, 1, 2, 0), pinned=pinned)
    P = prompt.shape[1]
    for ids in seen:
        rows = ids.view(-1, 2, ids.shape[1])[:, :, P:P + 16]  # (copies, B, L)
        assert (rows[:, pinned] == comp[pinned]).all(), name
    # the estimate reads no pinned position's log-probability: a network whose output at pinned
    # positions is shifted gives the same estimate
    def shifted(ids, attn, position_ids=None):
        logits = logits_fn(net)(ids, attn) if position_ids is None else logits_fn(net)(ids, attn, position_ids)
        bump = torch.zeros_like(logits)
        bump[:, P:P + 16][pinned.repeat(ids.shape[0] // 2, 1)] = 5.0 * torch.arange(logits.shape[-1]).float()
        return logits + bump
    again = est(shifted, prompt, pmask, comp, scored, mask_seeds(0, 1, 2, 0), pinned=pinned)
    keep = scored.bool() if out.dim() == 2 else torch.ones(2, dtype=torch.bool)
    assert torch.allclose(out[keep], again[keep], atol=1e-5), name


def test_a_rollout_pins_the_givens_and_the_loss_ignores_them(tmp_path):
    c = build(compose_cfg(["task.pin_givens=true"], tmp_path))
    items = c.task.splits.train[:2]
    ro = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler)(items, c.bundle.net, 0)
    canvas = c.task.canvas(ro.items, c.bundle.tokenizer, 16, c.bundle.mask_token_id)
    assert torch.equal(ro.pinned, canvas != c.bundle.mask_token_id) and bool(ro.pinned.any())
    assert torch.equal(ro.completion_ids[ro.pinned], canvas[ro.pinned])
    assert not bool((ro.scored_mask.bool() & ro.pinned).any())
    tok = c.bundle.tokenizer
    for row, pins, item in zip(ro.completion_ids.tolist(), ro.pinned.tolist(), ro.items):
        assert [tok.decode([t]) for t, p in zip(row, pins) if p] == [d for d in item["puzzle"] if d != "0"]


def test_the_warm_start_never_masks_a_pinned_token(tiny_bundle):
    _, canvas = canvas_of(tiny_bundle)
    pinned = canvas != tiny_bundle.mask_token_id
    prompt, pmask = encode_prompts(tiny_bundle.tokenizer, [f"{it['puzzle']}=" for it in ITEMS])
    target = torch.where(pinned, canvas, torch.full_like(canvas, 5))
    seen: list[torch.Tensor] = []
    masked_diffusion_loss(_spy(logits_fn(tiny_bundle.net), seen), prompt, pmask, target, tiny_bundle.mask_token_id,
                          torch.Generator().manual_seed(0), t_min=0.99, pinned=pinned)
    comp = seen[0][:, prompt.shape[1]:]
    assert (comp[pinned] == target[pinned]).all() and (comp[~pinned] == tiny_bundle.mask_token_id).all()


def test_the_d1_protocol_refuses_pinned_givens():
    from diffusion_rl.app.evaluate import check_protocol

    with pytest.raises(ConfigError, match="task.pin_givens=True is invalid: eval.protocol=d1 scores the grid"):
        check_protocol("d1", SudokuTask(SudokuConfig(pin_givens=True)))
    check_protocol("d1", SudokuTask(SudokuConfig(pin_givens=False)))
