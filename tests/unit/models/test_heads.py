"""The output head only where needed (models/heads.py): the same numbers as computing every logit.

For each model family (the embedded model, its block variant, our LLaDA / Dream / SDAR on tiny
checkpoints in the released layouts, and a Hugging Face Llama through ``model=hf``) and each
likelihood estimator that applies, the estimate through the policy forward (body, then the chunked
fused head at the scored positions only) equals the estimate from full logits, values and gradients
to 1e-6 in fp32; the head is split into many chunks here so that chunking is exercised. The sampler
gives the same tokens whether it asks for the block's logits only or slices full ones, greedily and
with the same Gumbel seed.
"""

from __future__ import annotations

import pytest
import torch

import diffusion_rl.models.heads as heads
from diffusion_rl.likelihood.base import LikelihoodConfig, mask_seeds
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.likelihood.staircase import StaircaseConfig, StaircaseEstimator
from diffusion_rl.likelihood.stepwise import stepwise_logps
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.heads import token_logps_chunked
from diffusion_rl.models.policy import ModelConfig, PolicyBundle, encode_prompts, logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from tests.helpers.released_layouts import BLOCK_SIZE, write_checkpoint
from tests.helpers.tiny_hf import save_tiny_hf

FAMILIES = ["tiny", "tiny_block", "llada", "dream", "sdar", "hf"]


def full_logits(net):
    """The reference: every position's logits, sliced afterwards (a plain callable, no head split)."""
    def forward(ids, attn, position_ids=None):
        kw = {} if position_ids is None else {"position_ids": position_ids}
        return net(input_ids=ids, attention_mask=attn, **kw).logits.float()
    return forward


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, PolicyBundle]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("heads")
    out = {"tiny": build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2)),
           "tiny_block": build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=4))}
    for arch in ("llada", "dream", "sdar"):
        attention = "native" if arch == "sdar" else "bidirectional"  # as the presets: SDAR is block-causal
        folder = write_checkpoint(arch, root / arch, real_ids=False)
        out[arch] = build_policy(ModelConfig(name="hf", path=str(folder), attention=attention,
                                             block_size=BLOCK_SIZE[arch]))
    out["hf"] = build_policy(ModelConfig(name="hf", path=str(save_tiny_hf(root / "llama"))))
    return out


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(heads, "HEAD_CHUNK", 5)  # every call below spans several chunks


def batch(bundle: PolicyBundle, L: int = 8):
    prompts = ["12=", "3", "40+1=", "0"]
    ids, mask = encode_prompts(bundle.tokenizer, prompts, pad_to_multiple_of=bundle.block_size)  # (B, P)
    g = torch.Generator().manual_seed(1)
    comp = torch.randint(3, 40, (len(prompts), L), generator=g)  # (B, L) real tokens of every vocabulary here
    cmask = torch.ones(len(prompts), L)
    cmask[1, 5:] = 0  # one completion ended early
    return ids, mask, comp, cmask


def test_chunked_fused_head_equals_log_softmax_gather_with_gradients():
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(6, 50, bias=False)
    hidden = torch.randn(3, 7, 6, generator=g, requires_grad=True)
    targets = torch.randint(50, (3, 7), generator=g)
    select = torch.rand(3, 7, generator=g) > 0.3
    ours = token_logps_chunked(head, hidden, targets, select, chunk=4)
    ref = torch.log_softmax(head(hidden).float(), -1).gather(-1, targets[..., None]).squeeze(-1) * select
    assert torch.allclose(ours, ref, atol=1e-6) and bool((ours[~select] == 0).all())
    w = torch.randn(3, 7, generator=g)
    g_ours = torch.autograd.grad((ours * w).sum(), [hidden, head.weight])
    g_ref = torch.autograd.grad((ref * w).sum(), [hidden, head.weight])
    for a, b in zip(g_ours, g_ref):
        assert torch.allclose(a, b, atol=1e-6)


def _estimators(bundle: PolicyBundle):
    mask = bundle.mask_token_id
    if bundle.block_size:
        est = StaircaseEstimator(StaircaseConfig(num_samples=2, p_mask_prompt=0.3), mask)
        est.bind(bundle)
        return {"staircase": est}
    return {"one_step": OneStepEstimator(LikelihoodConfig(p_mask_prompt=0.3), mask),
            "elbo": ELBOEstimator(ELBOConfig(num_samples=3, p_mask_prompt=0.3), mask)}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_estimator_through_the_split_head_equals_full_logits(bundles, family):
    bundle = bundles[family]
    net = bundle.net.float()
    ids, mask, comp, cmask = batch(bundle)
    seeds = mask_seeds(0, 3, ids.shape[0], 1)
    for name, est in _estimators(bundle).items():
        params = [p for p in net.parameters() if p.requires_grad]
        ours = est(logits_fn(net), ids, mask, comp, cmask, seeds)
        g_ours = torch.autograd.grad(ours.sum(), params, allow_unused=True)
        ref = est(full_logits(net), ids, mask, comp, cmask, seeds)
        g_ref = torch.autograd.grad(ref.sum(), params, allow_unused=True)
        assert torch.allclose(ours, ref, atol=1e-6, rtol=1e-6), (family, name)
        for a, b in zip(g_ours, g_ref):
            assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-6, rtol=1e-5)), (family, name)


@pytest.mark.parametrize("family", ["tiny", "llada", "dream", "hf"])
def test_stepwise_likelihood_through_the_split_head_equals_full_logits(bundles, family):
    bundle = bundles[family]
    net = bundle.net.float()
    ids, mask, comp, _ = batch(bundle)
    states = torch.cat([ids, comp], 1)  # (B, T)
    g = torch.Generator().manual_seed(2)
    still = torch.rand(states.shape, generator=g) < 0.5
    still[:, : ids.shape[1]] = False
    committed = still & (torch.rand(states.shape, generator=g) < 0.5)
    states = states.masked_fill(still, bundle.mask_token_id)
    attn = torch.cat([mask, torch.ones_like(comp)], 1)
    tokens = torch.cat([ids, comp], 1)
    ours = stepwise_logps(logits_fn(net), states, attn, committed, tokens)
    ref = stepwise_logps(full_logits(net), states, attn, committed, tokens)
    assert torch.allclose(ours, ref, atol=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("family", FAMILIES)
def test_sampler_tokens_do_not_depend_on_where_the_head_runs(bundles, family, temperature):
    """Block logits only (the policy forward) or every position's, sliced: the same tokens, greedy and
    with the same Gumbel seed (the noise is drawn for the block's positions in both)."""
    bundle = bundles[family]
    net = bundle.net.float().eval()
    ids, mask, _, _ = batch(bundle)
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=temperature)

    class SlicesFullLogits(torch.nn.Module):  # the network, but every call computes all logits
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            for k in ("supports_kv_cache", "kv_cache_any_order", "logits_shift", "mask_padding", "config"):
                if hasattr(inner, k):
                    setattr(self, k, getattr(inner, k))

        def forward(self, keep=None, targets=None, select=None, **kw):
            out = self.inner(**kw)
            out.logits = out.logits if keep is None else out.logits[:, keep]
            return out

    outs = [sample(bundle, ids, mask, cfg, RowNoise.rows(5, 0, ids.shape[0]), net=n).completion
            for n in (net, SlicesFullLogits(net))]
    assert torch.equal(outs[0], outs[1])
