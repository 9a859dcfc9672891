"""ESPO's ELBO: mask counts spread evenly over the batch, each masked set paired with its complement.

Row ``b`` of a batch of ``B`` has ``n_b`` scored positions (the ``completion_mask`` the caller passes:
ESPO passes every generated position, ``n_b = L``). One offset ``k`` per batch spreads the mask counts
evenly over the rows, and each row masks a uniformly random subset of that size::

    x_b = round(k + b (n + 1) / B) mod (n + 1)                     (a float32 linspace, as ESPO rounds it)
    term_i = 1/2 [ log p(x_i | masked set)  / t      if i in the masked set,  t  = x_b / (n + 1)
                   log p(x_i | complement) / t'     otherwise,               t' = (n - x_b) / (n + 1) ]
    ELBO_b = mean over num_samples draws of  sum_i term_i

Both halves are unbiased for the discrete masked-diffusion ELBO ``sum_{m=1..n} E_{|M|=m}[sum_{i in M}
log p(x_i | x_M masked)] / m``, since ``x`` and ``n - x`` are both uniform on ``0..n`` (a count of 0
contributes nothing). Returned per position (``per_token = True``; the terms sum to the ELBO), so a
sequence objective sums them (``objective=espo``) and a per-token one can read them as weighted
token log-probs. Positions outside the caller's mask are masked in every copy and never scored.

Source: ESPO (ML-GSAI/ESPO @ b5f2dac, ``espo/espo_trainer.py``: ``forward_process`` builds the counts and
masks, ``_get_elbo`` the two weighted passes, ``_get_elbo_mc`` the mean over ``num_mc``). Choices and
deviations:

- *Batch-level draw.* ESPO draws ``k ~ U{0..L}`` and a ``randperm`` per row from the global generator
  reseeded with the micro-batch's mask seed (one per micro-batch, iteration and Monte Carlo sample).
  Here ``k = floor(v (n + 1))`` with ``v`` uniform from a local generator seeded from every row's
  mask seed of the call (:func:`~diffusion_rl.likelihood.base.batch_seed`, so from the run seed, the
  rollout id and the inner iteration), and the random subset is the ``x_b`` positions with the
  smallest uniform keys of the row's own generator (``sample_seeds(seeds, k)`` for draw ``k``): the
  same distribution. The batch is the rows of one call: the whole rollout batch on one process (ESPO:
  the per-device micro-batch, 3 rows in its Sudoku / GSM8K scripts), each process's share under data
  parallelism. Rounding ties of ``x_b`` follow ``torch.round`` of the same float32 ``linspace``.
- *Rows with fewer scored positions* (a caller that passes the completion mask up to EOS): the same
  ``v`` gives each row its ``k_b = floor(v (n_b + 1))`` and ``x_b`` on its own ``n_b + 1`` counts;
  with every ``n_b = L`` this is ESPO's construction exactly.
- ``coupled`` (default true) is ESPO's ``reduce_var``, which its trainer never forwards, so the public
  code always runs the complementary pass; ``coupled=false`` is what ``reduce_var=false`` would have
  computed (one pass, weight ``1/t``, not halved).
- *A completion token equal to the mask id* (a position the sampler left masked): ESPO reads its
  masked set back from the noisy input (``perturbed_seq == mask_id``), so such a token counts as masked
  in its first pass whatever the draw; here every position is scored where the draw puts it.
- ``p_mask_prompt`` (default 0: ESPO never masks the prompt) masks each real prompt token with that
  probability, the same in both copies. One batched forward covers every copy (ESPO: two forwards per
  Monte Carlo sample); the rollout's attention mask is passed (ESPO passes none); fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    batch_uniform,
    forward_logps,
    rand_rows,
    show_pinned,
)
from diffusion_rl.likelihood.elbo import sample_seeds

_OFFSET_SALT = 0xE5B0


@dataclass
class StratifiedConfig(LikelihoodConfig):
    name: str = "stratified"
    p_mask_prompt: float = 0.0  # ESPO never masks the prompt
    num_samples: int = 2  # ESPO's num_mc in every run script (its train.yaml says 1)
    coupled: bool = True  # ESPO's reduce_var: score the complement too and average (the public code always does)

    def validate(self) -> None:
        super().validate()
        if self.num_samples < 1:
            raise ConfigError("likelihood.num_samples", self.num_samples, "must be >= 1")


@dataclass
class StratifiedDraw:
    prompt_hit: torch.Tensor  # (K, B, P) bool
    keys: torch.Tensor  # (K, B, L) uniform keys: the x_b scored positions with the smallest are masked
    offset: torch.Tensor  # (K, B) long, k_b of the count spread
    counts: torch.Tensor  # (K, B) long, x_b
    masked: torch.Tensor  # (K, B, L) bool, the masked set (scored positions only)


def spread_counts(v: float, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ESPO's evenly spread mask counts for rows with ``n`` (B,) scored positions: offsets
    ``k_b = floor(v (n_b + 1))`` and counts ``x_b = round(linspace(k_b, k_b + (B-1)(n_b+1)/B, B)[b])
    mod (n_b + 1)``, both (B,) long."""
    B = n.shape[0]
    k = torch.minimum((v * (n + 1).double()).floor().long(), n)  # (B,)
    x = torch.zeros_like(n)
    for m in n.unique().tolist():  # one linspace per distinct length, as ESPO builds it for n = L
        km = int(k[n == m][0])
        row = torch.round(torch.linspace(float(km), km + (B - 1) * ((m + 1) / B), steps=B)).long() % (m + 1)
        x = torch.where(n == m, row.to(n.device), x)
    return k, x


def subset_of_size(keys: torch.Tensor, scored: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The ``counts`` scored positions of each row with the smallest keys: a uniformly random subset of
    that size. keys (..., L), scored (..., L) bool, counts (...) -> (..., L) bool"""
    k = torch.where(scored, keys, torch.full_like(keys, 2.0))  # unscored positions rank last
    rank = k.argsort(-1).argsort(-1)  # (..., L)
    return (rank < counts[..., None]) & scored


def stratified_token_terms(lp: torch.Tensor, lp_comp: torch.Tensor | None, masked: torch.Tensor,
                           scored: torch.Tensor, counts: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Each position's term of ESPO's ELBO; their sum over positions is the ELBO of the draw.

    lp, lp_comp (..., L) log-probs of the masked-set copy and of the complementary copy (None: one pass),
    masked and scored (..., L) bool, counts (...) and n (...) long -> (..., L), 0 where not scored.
    """
    np1 = (n + 1).to(lp.dtype)
    t = counts.clamp_min(1).to(lp.dtype) / np1  # a count of 0 masks nothing: any finite weight
    terms = torch.where(masked, lp / t[..., None], torch.zeros_like(lp))
    if lp_comp is None:
        return terms
    t_comp = (n - counts).clamp_min(1).to(lp.dtype) / np1
    terms = terms + torch.where(scored & ~masked, lp_comp / t_comp[..., None], torch.zeros_like(lp))
    return terms / 2


@LIKELIHOODS.register("stratified")
class StratifiedEstimator(LikelihoodEstimator):
    config_class = StratifiedConfig
    per_token = True
    cfg: StratifiedConfig

    def draw(self, seeds: list[int], prompt_mask: torch.Tensor, scored: torch.Tensor) -> StratifiedDraw:
        """Draw ``k`` of ``K`` uses ``sample_seeds(seeds, k)``: its rows' numbers ``(prompt, keys)`` and,
        from all of them, the batch's offset."""
        P = prompt_mask.shape[1]
        n = scored.sum(-1)  # (B,)
        out = []
        for k in range(self.cfg.num_samples):
            s = sample_seeds(seeds, k)
            u = rand_rows(s, P + scored.shape[1], scored.device)[0]  # (B, P + L)
            offset, counts = spread_counts(batch_uniform(s, _OFFSET_SALT), n)
            keys = u[:, P:]
            hit = (u[:, :P] < self.cfg.p_mask_prompt) & prompt_mask.bool()
            out.append((hit, keys, offset, counts, subset_of_size(keys, scored, counts)))
        return StratifiedDraw(*(torch.stack(parts) for parts in zip(*out)))

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        """One forward over the ``K`` masked-set copies and (``coupled``) their complements. -> (B, L)"""
        B, P = prompt_ids.shape
        L = completion_ids.shape[1]
        scored = completion_mask.bool()
        d = self.draw(seeds, prompt_mask, scored)
        K = d.masked.shape[0]
        masked = torch.stack([d.masked, scored & ~d.masked] if self.cfg.coupled else [d.masked])  # (C, K, B, L)
        C = masked.shape[0]
        noisy = show_pinned(torch.where(masked | ~scored, self.mask_id, completion_ids), completion_ids,
                            pinned)  # (C, K, B, L)
        noisy_prompt = torch.where(d.prompt_hit, self.mask_id, prompt_ids).expand(C, K, B, P)
        ids = torch.cat([noisy_prompt, noisy], -1).reshape(C * K * B, P + L)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1).repeat(C * K, 1)
        lp = forward_logps(forward, ids, attn, completion_ids.repeat(C * K, 1), P,
                           select=masked.reshape(C * K * B, L)).view(C, K, B, L)  # each copy read where it masks
        terms = stratified_token_terms(lp[0], lp[1] if C == 2 else None, d.masked, scored, d.counts,
                                       scored.sum(-1))  # (K, B, L)
        return terms.mean(0)
