"""Complementary masks with a fully masked pass (DiffuCoder's coupled sampling): per-token log-probs.

Three noisy copies of each completion go through one batched forward: every completion token masked
(``full``); the tokens with ``u_i < t`` masked (``half``); the others masked (``comp``, the
complement). Each token is masked in exactly one of ``half`` and ``comp`` and is scored there, its
log-prob weighted by the inverse of that copy's masking rate::

    log p_i = 1/2 * [ log p(x_i | full) + ( log p(x_i | half) / t        if u_i <  t
                                            log p(x_i | comp) / (1 - t)  otherwise ) ]

``t ~ U(t_min, t_max)``, ``(0.2, 0.8)`` in the public code. Per token (``per_token = True``), so any
per-token objective can use it (``objective=coupled_grpo`` is its own, ``grpo`` or ``espo`` too).

Source: DiffuCoder (Gong et al. 2025), apple/ml-diffucoder @ f735e01, ``src/open_r1/coupled_grpo.py``:
``forward_process`` (the three copies, weights ``[1, 1/t, 1/(1-t)]``) and ``selective_log_softmax``
(the combination above). Choices and deviations:

- *One t per batch.* The public code draws one ``t`` per call from the global generator reseeded with
  the iteration's mask seed, so every row of an iteration shares it (and, through that reseeding, every
  micro-batch of a device shares ``t`` and reuses the same uniform rows at the same offsets). Here
  ``t_per=batch`` (default) draws one ``t`` for the rows of a call from a local generator seeded from
  all of their mask seeds (:func:`~diffusion_rl.likelihood.base.batch_seed`), i.e. from the run seed,
  the rollout id and the inner iteration; the per-token uniforms ``u`` come from each row's own
  generator, so rows are independent given ``t``. On one process a call holds the whole rollout batch
  (the public code's draw); under data parallelism each process's share draws its own ``t``.
  ``t_per=sample`` gives each row its own ``t`` (same marginal per row, no coupling across rows).
- *Exact complement.* The public third copy masks ``u > t``, so a token with ``u == t`` (probability
  ~2^-24 in float32) is masked in neither; here ``comp = not half``: every token is scored exactly once
  per pair.
- *Tokens after the first EOS* are masked and unmasked like any other, as in the public code (the
  estimator reads no completion mask; the objective's mask decides which tokens count).
- *Prompt.* ``p_mask_prompt`` (default 0, as the public ``forward_process``, which never masks it)
  masks each real prompt token with that probability, the same mask in the three copies.
- The forward carries the rollout's attention mask (the public code passes none: padding is attended);
  Dream's shifted logits are the model adapter's business (the public ``get_logits`` drops the last
  position). All in fp32 (the public code runs under bf16 autocast).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    batch_uniform,
    forward_logps,
    rand_rows,
    unpinned,
)

_T_SALT = 0xC0C0


@dataclass
class ComplementaryConfig(LikelihoodConfig):
    name: str = "complementary"
    p_mask_prompt: float = 0.0  # the public forward_process never masks the prompt
    t_min: float = 0.2  # t ~ U(t_min, t_max), the public code's range
    t_max: float = 0.8
    t_per: str = "batch"  # batch: one t for the rows of a call (the public code) | sample: one t per row

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.t_min < 1.0:
            raise ConfigError("likelihood.t_min", self.t_min, "must be in (0, 1)")
        if not self.t_min <= self.t_max < 1.0:
            raise ConfigError("likelihood.t_max", self.t_max, f"must be in [t_min={self.t_min}, 1): the complement is weighted 1/(1 - t)")
        check_choice("likelihood.t_per", self.t_per, ("batch", "sample"))


@dataclass
class ComplementaryDraw:
    prompt_hit: torch.Tensor  # (B, P) bool, prompt tokens masked in all three copies
    u: torch.Tensor  # (B, L) the per-token uniforms
    t: torch.Tensor  # (B,) masking rate of the half copy (one value for all rows with t_per=batch)

    @property
    def half(self) -> torch.Tensor:
        """(B, L) bool, masked in the half copy; the complementary copy masks the rest."""
        return self.u < self.t[:, None]


def coupled_token_logps(full: torch.Tensor, half_lp: torch.Tensor, comp_lp: torch.Tensor, half: torch.Tensor,
                        t: torch.Tensor) -> torch.Tensor:
    """``1/2 [full + (half_lp / t where half, else comp_lp / (1 - t))]``. (B, L) x 4, t (B,) -> (B, L)"""
    weighted = torch.where(half, half_lp / t[:, None], comp_lp / (1 - t)[:, None])  # (B, L)
    return (full + weighted) / 2


@LIKELIHOODS.register("complementary")
class ComplementaryEstimator(LikelihoodEstimator):
    config_class = ComplementaryConfig
    per_token = True
    cfg: ComplementaryConfig

    def draw(self, seeds: list[int], prompt_mask: torch.Tensor, L: int) -> ComplementaryDraw:
        """Each row's numbers come from its own generator in the layout ``(t, prompt, completion)``;
        with ``t_per=batch`` the first is unused and ``t`` comes from the call's shared generator."""
        c = self.cfg
        B, P = prompt_mask.shape
        u = rand_rows(seeds, 1 + P + L, prompt_mask.device)[0]  # (B, 1 + P + L)
        r = u[:, 0] if c.t_per == "sample" else torch.full((B,), batch_uniform(seeds, _T_SALT), device=u.device)
        t = c.t_min + (c.t_max - c.t_min) * r  # (B,)
        prompt_hit = (u[:, 1:1 + P] < c.p_mask_prompt) & prompt_mask.bool()
        return ComplementaryDraw(prompt_hit, u[:, 1 + P:], t)

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        """One forward over the three copies ``[full; half; comp]`` of ``3 B`` rows. -> (B, L)"""
        B, P = prompt_ids.shape
        L = completion_ids.shape[1]
        d = self.draw(seeds, prompt_mask, L)
        half = d.half
        masked = unpinned(torch.stack([torch.ones_like(half), half, ~half]), pinned)  # (3, B, L); pinned: context
        noisy_prompt = torch.where(d.prompt_hit, self.mask_id, prompt_ids)  # (B, P)
        noisy = torch.where(masked, self.mask_id, completion_ids)  # (3, B, L)
        ids = torch.cat([noisy_prompt.expand(3, B, P), noisy], -1).reshape(3 * B, P + L)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1).repeat(3, 1)  # (3B, P+L)
        lp = forward_logps(forward, ids, attn, completion_ids.repeat(3, 1), P,
                           select=masked.reshape(3 * B, L)).view(3, B, L)  # each copy read where it masks
        return coupled_token_logps(lp[0], lp[1], lp[2], half, d.t)
