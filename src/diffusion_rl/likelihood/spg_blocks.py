"""SPG's block-wise Monte Carlo masks (``likelihood=spg_blocks``), scored in one batched forward.

Source: Sandwiched Policy Gradient (SPG), facebookresearch/SPG @ a1c7120, ``spg/spg_trainer.py``:
``forward_process`` with ``forward_type=block_random`` (~L334-378) and the masked-token average of
``_get_per_seq_logps`` (~L489-532). For every sequence and Monte Carlo sample ``k = 1..K`` (SPG's
``num_t``, 2 in its scripts), with the completion cut into blocks of ``block_length`` positions:

1. choose a completion block ``b_k`` (among the ``m`` blocks that hold completion tokens);
2. in it, mask exactly ``c`` of its ``r`` completion positions at random places, ``c`` uniform on
   ``[max(floor(r t_min), 1), min(floor(r t_max), r)]`` (SPG's ``min_t = 0``, ``max_t = 1``);
3. mask every later block fully, and every position outside the completion mask (after the first EOS);
4. mask each remaining position -- the prompt *and the earlier completion blocks* -- with probability
   ``p_mask_prompt`` (0.15).

Every masked completion position is scored: ``ELBO_k`` = mean of their log-probs, ``t_k`` = their count
over the completion length, and ``ELBO = mean_k ELBO_k`` (:meth:`reduce`). SPG's upper bound comes from
the same draws through :func:`~diffusion_rl.likelihood.elbo.eubo_from_logps` (``t_k`` is its 1/t weight).

The public code's quirks, each reproduced by default and switchable:

- ``block_choice=permute`` (SPG): one random permutation of the ``n`` generation blocks per sequence,
  ``b_k = perm[k] % m``; the ``K`` samples start from distinct blocks, but when ``n`` is not a multiple
  of ``m`` the early blocks are chosen more often (``n = 3, m = 2``: block 0 with probability 2/3).
  ``uniform``: each sample picks its block uniformly among the ``m``.
- ``score_later_blocks=true`` (SPG): the fully masked later blocks enter the average too. SPG builds a
  block mask that would leave them out and never applies it; ``false`` applies it (they stay masked in
  the input, unscored; ``t_k`` still counts them, as SPG's does).
- ``noise_earlier_blocks=true`` (SPG): its prompt-masking draw covers every position before the chosen
  block, so earlier completion blocks lose ~15% of their tokens, which are then scored too; ``false``
  keeps them clean (only the prompt is masked with ``p_mask_prompt``).

Reproduced without a switch: positions outside the completion mask are always masked and never
scored (the EOS padding never conditions anything), and ``t_k`` = masked count / completion length.
Deviations: the random numbers come from one local generator per row (:func:`rand_rows`), so the old
and new policy see the same masks (SPG seeds the global RNG once per iteration for the whole batch);
the scored positions are those drawn (SPG reads them back as ``noisy == mask_id``, which also counts
a completion token that *is* the mask token, as an untrained sampler may commit);
prompt padding is never masked (SPG's draw covers padded prompt positions too); a completion
length that is not a multiple of ``block_length`` ends in a shorter block and ``K > n`` makes sample
``k`` use ``perm[k mod n]`` (SPG asserts against both); the mask passed in may have holes
(``task.loss_mask=reward``): its positions are the "completion", every other one is treated as SPG
treats tokens after the EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    forward_logps,
    rand_rows,
    show_pinned,
    unpinned,
)
from diffusion_rl.likelihood.elbo import ELBOSample, elbo_from_logps


@dataclass
class SPGBlocksConfig(LikelihoodConfig):
    name: str = "spg_blocks"
    # p_mask_prompt (0.15, inherited) is SPG's; it also noises the earlier blocks (noise_earlier_blocks)
    num_samples: int = 2  # K, SPG's num_t
    block_length: int = 32  # SPG's (and d1's) block length
    t_min: float = 0.0  # the chosen block's masked share: SPG's min_t / max_t
    t_max: float = 1.0
    block_choice: str = "permute"  # permute (SPG: perm[k] % m) | uniform
    score_later_blocks: bool = True  # SPG: its block mask is built but unused
    noise_earlier_blocks: bool = True  # SPG: earlier blocks masked with p_mask_prompt, like the prompt

    def validate(self) -> None:
        super().validate()
        if self.num_samples < 1:
            raise ConfigError("likelihood.num_samples", self.num_samples, "must be >= 1")
        if self.block_length < 1:
            raise ConfigError("likelihood.block_length", self.block_length, "must be >= 1")
        if not 0.0 <= self.t_min <= 1.0:
            raise ConfigError("likelihood.t_min", self.t_min, "must be in [0, 1]")
        if not self.t_min <= self.t_max <= 1.0:
            raise ConfigError("likelihood.t_max", self.t_max, f"must be in [t_min={self.t_min}, 1]")
        check_choice("likelihood.block_choice", self.block_choice, ("permute", "uniform"))


@dataclass
class SPGMasks:
    """One call's draws: what the input hides and what is scored."""

    prompt_hit: torch.Tensor  # (K, B, P) bool, prompt tokens replaced by the mask token
    noised: torch.Tensor  # (K, B, L) bool, completion positions masked in the input
    scored: torch.Tensor  # (K, B, L) bool, masked completion-mask positions whose log-probs count
    t: torch.Tensor  # (K, B) masked completion-mask positions / completion length
    block: torch.Tensor  # (K, B) the chosen block


@LIKELIHOODS.register("spg_blocks")
class SPGBlocksEstimator(LikelihoodEstimator):
    config_class = SPGBlocksConfig
    per_token = False
    cfg: SPGBlocksConfig

    def choose_blocks(self, perm_keys: torch.Tensor, u_blk: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The block of each sample: (B, n) permutation keys, (K, B) uniforms, (B,) blocks -> (K, B)."""
        K, n = u_blk.shape[0], perm_keys.shape[1]
        if self.cfg.block_choice == "permute":
            perm = perm_keys.argsort(-1)  # (B, n) a uniformly random permutation, as randperm(n)
            return perm[:, torch.arange(K, device=m.device) % n].T % m  # (K, B)
        return (u_blk * m).floor().long().clamp(max=m - 1)  # (K, B)

    def draw(self, seeds: list[int], prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> SPGMasks:
        """The ``K`` masks of every row, each row from its own generator ``seeds[b]``."""
        c = self.cfg
        B, P = prompt_mask.shape
        L = completion_mask.shape[1]
        K, dev = c.num_samples, completion_mask.device
        n = -(-L // c.block_length)  # generation blocks; the last may be shorter
        per = 2 + P + 2 * L  # per sample: block, count, prompt, places, earlier-block noise
        u = rand_rows(seeds, n + K * per, dev)[0]  # (B, n + K * per)
        perm_keys = u[:, :n]  # (B, n)
        r = u[:, n:].reshape(B, K, per).transpose(0, 1)  # (K, B, per)
        u_blk, u_cnt, u_prompt = r[..., 0], r[..., 1], r[..., 2:2 + P]  # (K, B), (K, B), (K, B, P)
        u_place, u_noise = r[..., 2 + P:2 + P + L], r[..., 2 + P + L:]  # (K, B, L) each
        cm = completion_mask.bool()  # (B, L)
        pos = torch.arange(L, device=dev)
        blk_of = (pos // c.block_length)[None, None]  # (1, 1, L)
        m = (torch.where(cm, pos, torch.full_like(pos, -1)).amax(-1) // c.block_length + 1).clamp_min(1)  # (B,)
        block = self.choose_blocks(perm_keys, u_blk, m)  # (K, B)
        in_blk = (blk_of == block[..., None]) & cm  # (K, B, L) the chosen block's completion positions
        chosen = self.mask_in_block(in_blk, u_cnt, u_place)  # (K, B, L)
        later = blk_of > block[..., None]  # (K, B, L)
        earlier_hit = (blk_of < block[..., None]) & (u_noise < c.p_mask_prompt)  # (K, B, L)
        if not c.noise_earlier_blocks:
            earlier_hit = torch.zeros_like(earlier_hit)
        noised = chosen | later | earlier_hit | ~cm  # (K, B, L)
        masked = noised & cm  # (K, B, L)
        scored = masked if c.score_later_blocks else masked & ~later
        t = masked.sum(-1) / cm.sum(-1).clamp_min(1)  # (K, B)
        prompt_hit = (u_prompt < c.p_mask_prompt) & prompt_mask.bool()  # (K, B, P)
        return SPGMasks(prompt_hit, noised, scored, t.float(), block)

    def mask_in_block(self, in_blk: torch.Tensor, u_cnt: torch.Tensor, u_place: torch.Tensor) -> torch.Tensor:
        """Exactly ``c`` of each block's ``r`` positions at uniformly random places; (K, B, L) -> (K, B, L)."""
        c = self.cfg
        r = in_blk.sum(-1)  # (K, B)
        lo = (r.float() * c.t_min).floor().long().clamp_min(1)  # SPG: max(int(r * min_t), 1)
        hi = torch.maximum(torch.minimum((r.float() * c.t_max).floor().long(), r), lo)  # >= lo: one at least
        count = (lo + (u_cnt * (hi - lo + 1)).floor().long()).clamp(max=hi)  # (K, B) uniform on [lo, hi]
        keys = torch.where(in_blk, u_place, torch.full_like(u_place, 2.0))  # positions outside rank last
        rank = keys.argsort(-1).argsort(-1)  # (K, B, L)
        return in_blk & (rank < count[..., None])

    def sample(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds,
               pinned=None) -> ELBOSample:
        """Draw the ``K`` masks and score them in one forward pass of ``K * B`` rows."""
        B, P = prompt_ids.shape
        L = completion_ids.shape[1]
        K = self.cfg.num_samples
        d = self.draw(seeds, prompt_mask, completion_mask)
        noisy_prompt = torch.where(d.prompt_hit, self.mask_id, prompt_ids)  # (K, B, P)
        noisy_comp = show_pinned(torch.where(d.noised, self.mask_id, completion_ids), completion_ids, pinned)  # (K, B, L)
        ids = torch.cat([noisy_prompt, noisy_comp], -1).reshape(K * B, P + L)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_mask)], 1).repeat(K, 1)  # (K*B, P+L)
        scored = unpinned(d.scored, pinned)  # (K, B, L)
        logps = forward_logps(forward, ids, attn, completion_ids.repeat(K, 1), P,
                              select=scored.reshape(K * B, L)).view(K, B, L)
        return ELBOSample(logps, scored, d.t)

    def reduce(self, s: ELBOSample) -> torch.Tensor:
        """SPG's ELBO: the mean over samples of each sample's mean scored log-prob. -> (B,)"""
        return elbo_from_logps(s.token_logps, s.masked, s.t, "mean")

    def sampler_units(self, token_logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """The same reduction of per-token log-probs (B, L) with every completion token scored. -> (B,)"""
        return elbo_from_logps(token_logp[None], completion_mask.bool()[None],
                               torch.ones_like(token_logp[None, :, 0]), "mean")

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        return self.reduce(self.sample(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned))
