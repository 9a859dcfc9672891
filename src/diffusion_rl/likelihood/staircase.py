"""Staircase ELBO of a block diffusion model (StableDRL; docs/methods.md §3): every block's term in
one forward.

A block model (SDAR) generates block ``b`` from the clean blocks ``< b``, so its ELBO is a sum of
per-block masked-diffusion ELBOs, each against the clean prefix::

    ELBO = mean_k sum_b w(t_kb) * sum_{i in block b, masked} log p_theta(x_i | clean blocks < b, noisy block b)

with ``w = 1/t`` (``inverse_t``) or ``1/|masked in the block|`` (``mean``), as in ``elbo.py``. One
forward per block costs O(number of blocks); feeding the noisy sequence alone would let block ``b``
see noisy (not clean) earlier blocks, a different model from the one that samples. The staircase
input ``[clean ; noisy]`` (length ``P + 2L``: prompt and completion, then the completion with masks,
both copies with the same position ids) and the mask of :func:`staircase_mask` give every block its
term in one forward, with no leakage: clean queries see clean keys of their own and earlier blocks;
noisy queries see clean keys of earlier blocks and noisy keys of their own block. ``one_pass=false``
runs the naive reference instead (one forward of ``[prompt, clean blocks < b, noisy block b]`` per
block, on the model's own block-causal attention); tests/unit/likelihood/test_staircase.py checks the two agree and
``benchmarks/block.py`` times them.

Masking follows ``elbo.py`` (its helpers, its options where they apply):

- ``K = num_samples`` noisy copies in one batched forward; each block draws its own ``t ~ U(t_min,
  t_max)`` and masks its scored tokens with probability ``t`` (at least one per block with a scored
  token). Per row and sample, the numbers come from the ELBO's local generator
  (``sample_seeds(seeds, k)``) in the ELBO's layout ``(t, unused, prompt, completion)`` with the ``t``
  of blocks ``1..`` appended, so a one-block completion draws exactly the ELBO's masks and the two
  estimators then agree.
- ``score_after_eos`` and ``p_mask_prompt`` as in the ELBO (masked prompt tokens are masked in the
  clean copy, the only copy of the prompt). ``antithetic`` and ``schedule=block_random`` are not
  offered: the staircase already scores every block against its clean prefix.
- Blocks are counted from the first input position over a prompt left-padded to whole blocks (as the
  block sampler does; see ``sampling/block.py``), so every completion block is a model block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodEstimator,
    force_at_least_one,
    forward_logps,
    rand_rows,
    show_pinned,
)
from diffusion_rl.likelihood.elbo import MonteCarloConfig, elbo_from_logps, sample_seeds
from diffusion_rl.sampling.block import align_prompt


@dataclass
class StaircaseConfig(MonteCarloConfig):
    """The ELBO's options, applied per block: each block draws its own ``t``."""

    name: str = "staircase"
    one_pass: bool = True  # false: one forward per block (the slow reference)


@dataclass
class StaircaseSample:
    token_logps: torch.Tensor  # (K, B, L) log p(x_i | clean prefix, noisy block); meaningful where masked
    masked: torch.Tensor  # (K, B, L) bool, masked and scored
    t: torch.Tensor  # (K, B, num_blocks) masking rate of each block


@functools.lru_cache(maxsize=64)
def staircase_mask(prompt_len: int, completion_len: int, block_size: int,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean (N, N), ``N = P + 2L``, over ``[prompt, clean completion, noisy completion]``.

    With ``blk`` the block of a position (the noisy copy has the blocks of the clean one), query
    ``a`` may attend key ``b`` iff (clean a, clean b, blk(b) <= blk(a)) or (noisy a, clean b,
    blk(b) < blk(a)) or (noisy a, noisy b, blk(b) == blk(a)). Built once per shape (cached; do not
    modify the returned tensor).
    """
    T = prompt_len + completion_len
    blk_clean = torch.arange(T, device=device) // block_size  # (T,)
    blk = torch.cat([blk_clean, blk_clean[prompt_len:]])  # (N,)
    noisy = torch.arange(T + completion_len, device=device) >= T  # (N,)
    qa, kb = blk[:, None], blk[None, :]  # (N, 1), (1, N)
    qn, kn = noisy[:, None], noisy[None, :]
    return (~qn & ~kn & (kb <= qa)) | (qn & ~kn & (kb < qa)) | (qn & kn & (kb == qa))  # (N, N)


def staircase_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, clean: torch.Tensor,
                     noisy: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one forward's input ``[prompt ; clean ; noisy]`` (B, N), its boolean mask (B|1, 1, N, N)
    and position ids (B, N); the noisy copy shares the clean positions. Prompt (B, P) whole blocks."""
    B, P = prompt_ids.shape
    L = clean.shape[1]
    N = P + 2 * L
    dev = prompt_ids.device
    ids = torch.cat([prompt_ids, clean, noisy], 1)  # (B, N)
    keep = prompt_mask.bool()  # (B, P)
    pos = (torch.cat([keep.long(), keep.new_ones(B, L, dtype=torch.long)], 1).cumsum(-1) - 1).clamp(min=0)  # (B, T)
    position_ids = torch.cat([pos, pos[:, P:]], 1)  # (B, N)
    mask = staircase_mask(P, L, block_size, dev)  # (N, N)
    if bool(keep.all()):
        attn = mask[None, None]  # (1, 1, N, N)
    else:  # padding keys are never attended; a padding query sees itself (a row with no key is NaN)
        key_ok = torch.cat([keep, keep.new_ones(B, 2 * L)], 1)  # (B, N)
        eye = torch.eye(N, dtype=torch.bool, device=dev)
        attn = ((mask & key_ok[:, None, :]) | eye)[:, None]  # (B, 1, N, N)
    return ids, attn, position_ids


def staircase_logits(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, clean: torch.Tensor,
                     noisy: torch.Tensor, block_size: int) -> torch.Tensor:
    """Logits of the noisy completion, each block against the clean prefix, in one forward.

    prompt (B, P) with P whole blocks, clean and noisy completions (B, L) -> (B, L, V)
    """
    ids, attn, position_ids = staircase_inputs(prompt_ids, prompt_mask, clean, noisy, block_size)
    return forward(ids, attn, position_ids)[:, prompt_ids.shape[1] + clean.shape[1]:]


def staircase_logps(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, clean: torch.Tensor,
                    noisy: torch.Tensor, block_size: int, select: torch.Tensor | None = None) -> torch.Tensor:
    """``log p(clean token)`` at each noisy position, from :func:`staircase_logits`'s forward. -> (B, L)

    ``select`` (B, L) bool: the positions read (the masked ones); the others hold 0."""
    ids, attn, position_ids = staircase_inputs(prompt_ids, prompt_mask, clean, noisy, block_size)
    start = prompt_ids.shape[1] + clean.shape[1]
    return forward_logps(forward, ids, attn, clean, start, select=select, position_ids=position_ids)


def per_block_logps(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, clean: torch.Tensor,
                    noisy: torch.Tensor, block_size: int, select: torch.Tensor | None = None) -> torch.Tensor:
    """The naive reference of :func:`staircase_logps`: one forward per block, on the model's own
    block-causal attention, of ``[prompt, clean blocks < b, noisy block b]``. -> (B, L)"""
    B, P = prompt_ids.shape
    L = clean.shape[1]
    out = []
    for s in range(0, L, block_size):
        e = s + block_size
        ids = torch.cat([prompt_ids, clean[:, :s], noisy[:, s:e]], 1)  # (B, P + e)
        attn = torch.cat([prompt_mask.long(), prompt_mask.new_ones(B, e, dtype=torch.long)], 1)
        sel = None if select is None else select[:, s:e]
        out.append(forward_logps(forward, ids, attn, clean[:, s:e], P + s, select=sel))  # (B, bs)
    return torch.cat(out, 1)


def block_elbo_from_logps(token_logps: torch.Tensor, masked: torch.Tensor, t: torch.Tensor, block_size: int,
                          weighting: str = "inverse_t") -> torch.Tensor:
    """``mean_k sum_b w(t_kb) sum_{i in b, masked} logp_{k,i}``. (K, B, L), (K, B, L), (K, B, nb) -> (B,)"""
    K, B, L = token_logps.shape
    nb = L // block_size
    per_block = elbo_from_logps(token_logps.reshape(K, B * nb, block_size), masked.reshape(K, B * nb, block_size),
                                t.reshape(K, B * nb), weighting)  # (B * nb,): each block is a row
    return per_block.view(B, nb).sum(-1)


@LIKELIHOODS.register("staircase")
class StaircaseEstimator(LikelihoodEstimator):
    config_class = StaircaseConfig
    per_token = False
    cfg: StaircaseConfig

    def __init__(self, cfg: StaircaseConfig, mask_id: int, block_size: int = 0):
        super().__init__(cfg, mask_id)
        self.block_size = block_size  # the model's; set by bind()

    def bind(self, bundle) -> None:
        if bundle.block_size < 1:
            raise ConfigError("likelihood.name", self.cfg.name,
                              "needs a block diffusion model (model.block_size > 0, e.g. model=tiny_block); "
                              "use likelihood=elbo for a masked diffusion model")
        if not bundle.custom_attention_mask:
            raise ConfigError("model.custom_attention_mask", False,
                              "likelihood=staircase needs a model whose attention accepts a custom 4D mask and "
                              "position ids; use likelihood=elbo with this model")
        self.block_size = bundle.block_size

    def draw(self, seeds: list[int], prompt_mask: torch.Tensor, completion_mask: torch.Tensor):
        """Prompt hits (K, B, P), completion masks (K, B, L) (scored positions only), t (K, B, nb), scored (B, L)."""
        c, bs = self.cfg, self.block_size
        B, P = prompt_mask.shape
        L = completion_mask.shape[1]
        nb = L // bs
        dev = completion_mask.device
        scored = torch.ones_like(completion_mask, dtype=torch.bool) if c.score_after_eos else completion_mask.bool()
        u = torch.stack([rand_rows(sample_seeds(seeds, k), 2 + P + L + nb - 1, dev)[0]
                         for k in range(c.num_samples)])  # (K, B, W): the ELBO's layout, then t of blocks 1..
        t = c.t_min + (c.t_max - c.t_min) * torch.cat([u[..., :1], u[..., 2 + P + L:]], -1)  # (K, B, nb)
        u_p, u_c = u[..., 2:2 + P], u[..., 2 + P:2 + P + L]  # (K, B, P), (K, B, L)
        prompt_hit = (u_p < c.p_mask_prompt) & prompt_mask.bool()
        sc = scored.expand_as(u_c).reshape(-1, B, nb, bs)  # (K, B, nb, bs)
        ub = u_c.reshape(-1, B, nb, bs)
        masked = force_at_least_one((ub < t[..., None]) & sc, sc, ub).reshape(-1, B, L)  # at least one per block
        return prompt_hit, masked, t, scored

    def sample(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds,
               pinned=None) -> StaircaseSample:
        """Draw the ``K`` masks and score every block of every copy in one forward of ``K * B`` rows."""
        if self.block_size < 1:
            raise RuntimeError("StaircaseEstimator is not bound to a block model: call bind(bundle) first")
        bs = self.block_size
        L = completion_ids.shape[1]
        if L % bs:
            raise ConfigError("sampler.gen_length", L, f"must be a multiple of model.block_size={bs}")
        prompt_ids, prompt_mask, _ = align_prompt(prompt_ids, prompt_mask, bs, self.mask_id)
        B, P = prompt_ids.shape
        K = self.cfg.num_samples
        prompt_hit, masked, t, scored = self.draw(seeds, prompt_mask, completion_mask)
        noisy_prompt = torch.where(prompt_hit, self.mask_id, prompt_ids).reshape(K * B, P)
        noisy = show_pinned(torch.where(masked | ~scored, self.mask_id, completion_ids), completion_ids,
                            pinned).reshape(K * B, L)
        clean = completion_ids.repeat(K, 1)  # (K*B, L)
        scorer = staircase_logps if self.cfg.one_pass else per_block_logps
        logps = scorer(forward, noisy_prompt, prompt_mask.repeat(K, 1), clean, noisy, bs,
                       select=masked.reshape(K * B, L))  # (K*B, L): only the masked tokens count
        return StaircaseSample(logps.view(K, B, L), masked, t)

    def reduce(self, s: StaircaseSample) -> torch.Tensor:
        """The block-summed ELBO of each row from a :meth:`sample`. -> (B,)"""
        return block_elbo_from_logps(s.token_logps, s.masked, s.t, self.block_size, self.cfg.weighting)

    def sampler_units(self, token_logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """The staircase's reduction of per-token log-probs (B, L), every scored token masked, t = 1. -> (B,)"""
        scored = torch.ones_like(completion_mask, dtype=torch.bool) if self.cfg.score_after_eos else completion_mask.bool()
        B, L = token_logp.shape
        t = token_logp.new_ones(1, B, L // self.block_size)
        return block_elbo_from_logps(token_logp[None], scored[None], t, self.block_size, self.cfg.weighting)

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        return self.reduce(self.sample(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned))
