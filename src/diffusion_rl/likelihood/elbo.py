"""Monte Carlo ELBO of a masked diffusion LM (StableDRL, SPG, LLaDA; docs/methods.md §3), one
batched forward.

For ``k = 1..K``: draw ``t_k ~ U(t_min, t_max)``, mask each scored completion token with probability
``t_k`` (at least one), and score the masked tokens::

    ELBO_k = w(t_k) * sum_{i masked} log p_theta(x_i | masked sequence)
    ELBO   = mean_k ELBO_k          w = 1/t_k ("inverse_t", LLaDA's ELBO) or 1/|masked| ("mean",
                                    the StableDRL / SPG reference code)

All ``K`` noisy copies go through the model in one forward (the copies are stacked along the batch).
Choices made here:

- *Scored tokens.* By default (``score_after_eos=false``, as the SPG / StableDRL reference code) the
  scored tokens are those of the completion mask (up to and including the first EOS); tokens after
  it are always masked in the input and never scored. ``score_after_eos=true`` scores the whole
  generated completion, EOS padding included, like LLaDA's SFT ELBO.
- *Prompt.* Each real prompt token is masked with probability ``p_mask_prompt``; the default is 0
  (the ELBO of ``log pi(x | q)`` conditions on the whole prompt). The reference code uses 0.15.
- *Randomness.* Sample ``k`` of row ``b`` draws all its numbers (``t``, block choice, prompt and
  completion masks) from one local generator seeded ``sample_seeds(seeds, k)[b]``: sample 0 uses the
  caller's seed itself, so a ``K``-sample call equals ``K`` one-sample calls with the derived seeds.
- *Antithetic* (``antithetic=true``, ``K`` even, ``schedule=uniform``): samples ``2m`` and ``2m+1``
  share one draw ``(t, u)``; the first masks ``u < t``, the second masks the complement with
  ``t' = 1 - t`` (coupled sampling). ``1 - t`` stays in ``[t_min, t_max]`` only when
  ``t_min + t_max = 1``, which the config requires. The at-least-one rule moves one token between
  the pair (the smallest ``u`` into the first, the largest into the second), so the two masks stay
  exact complements whenever two or more tokens are scored; with a single scored token both mask it.
  The pair shares its prompt mask.
- *block_random* (the reference code's ``forward_type``): pick a block of ``block_length`` scored
  positions uniformly, mask each of its tokens with probability ``t`` (at least one), mask every
  scored token after it, keep the ones before it clean. Its ``t`` is the fraction of scored tokens
  masked (as the reference code's EUBO uses); with it ``inverse_t`` is ``|scored| x`` the mean
  weighting, so ``weighting=mean`` is the reference setting. The reference permutes blocks so the
  ``K`` samples pick distinct blocks where possible and masks an exact count; here each sample picks
  its block independently and masks Bernoulli(t) per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError, check_choice
from diffusion_rl.core.seeding import mix_seed
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    force_at_least_one,
    forward_logps,
    rand_rows,
    show_pinned,
)

_SAMPLE_SALT = 0xE1B0


@dataclass
class MonteCarloConfig(LikelihoodConfig):
    """Options every Monte Carlo masked-diffusion ELBO shares (``elbo``, ``staircase``)."""

    p_mask_prompt: float = 0.0  # the reference code uses 0.15; 0 conditions on the whole prompt
    num_samples: int = 2  # K Monte Carlo samples, one batched forward
    # masking rates t ~ U(t_min, t_max). LLaDA's ELBO uses t_min = 0.001 (it keeps 1/t bounded); 0.5
    # keeps every copy at least half masked: lower variance, no longer LLaDA's bound. On the embedded
    # Sudoku model (seed 0) StableDRL gained +2.5 points with it, +0.6 with t ~ U(0.001, 1)
    t_min: float = 0.5
    t_max: float = 1.0
    # "inverse_t" (1/t_k, LLaDA's ELBO) or "mean" (1/|masked|, the StableDRL / SPG code): the 1/t
    # weights were the main noise source of the CPU runs
    weighting: str = "mean"
    score_after_eos: bool = False  # score tokens after the first EOS too (LLaDA) instead of masking them

    def validate(self) -> None:
        super().validate()
        if self.num_samples < 1:
            raise ConfigError("likelihood.num_samples", self.num_samples, "must be >= 1")
        if not 0.0 < self.t_min <= 1.0:
            raise ConfigError("likelihood.t_min", self.t_min, "must be in (0, 1]")
        if not self.t_min <= self.t_max <= 1.0:
            raise ConfigError("likelihood.t_max", self.t_max, f"must be in [t_min={self.t_min}, 1]")
        check_choice("likelihood.weighting", self.weighting, ("inverse_t", "mean"))


@dataclass
class ELBOConfig(MonteCarloConfig):
    name: str = "elbo"
    antithetic: bool = False  # pair each mask with its complement (t, 1 - t)
    schedule: str = "uniform"  # "uniform" or "block_random"
    block_length: int = 32  # block_random only

    def validate(self) -> None:
        super().validate()
        check_choice("likelihood.schedule", self.schedule, ("uniform", "block_random"))
        if self.block_length < 1:
            raise ConfigError("likelihood.block_length", self.block_length, "must be >= 1")
        if self.antithetic:
            if self.num_samples % 2:
                raise ConfigError("likelihood.num_samples", self.num_samples, "must be even with antithetic=true")
            if self.schedule != "uniform":
                raise ConfigError("likelihood.schedule", self.schedule, "antithetic=true needs schedule=uniform")
            if not math.isclose(self.t_min + self.t_max, 1.0, abs_tol=1e-9):
                raise ConfigError("likelihood.t_max", self.t_max,
                                  "antithetic=true needs t_min + t_max = 1 so that 1 - t stays in range "
                                  "(e.g. t_min=0.001 t_max=0.999)")


@dataclass
class ELBOSample:
    """The Monte Carlo draws of one call and their per-token log-probs."""

    token_logps: torch.Tensor  # (K, B, L) log p(x_i | noisy copy k); meaningful where masked
    masked: torch.Tensor  # (K, B, L) bool, masked *and* scored
    t: torch.Tensor  # (K, B) masking rate of each copy


def elbo_from_logps(token_logps: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                    weighting: str = "inverse_t") -> torch.Tensor:
    """``mean_k w(t_k) * sum_{i masked} logp_{k,i}``. (K, B, L), (K, B, L), (K, B) -> (B,)"""
    s = torch.where(masked, token_logps, torch.zeros_like(token_logps)).sum(-1)  # (K, B)
    if weighting == "inverse_t":
        per = s / t
    elif weighting == "mean":
        per = s / masked.sum(-1).clamp_min(1)
    else:
        raise ValueError(f"unknown weighting {weighting!r}")
    return per.mean(0)  # (B,)


def eubo_from_logps(token_logps: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                    beta: float = 1.5) -> torch.Tensor:
    """SPG's upper bound ``(1/beta) * mean_i log mean_k [masked_ki * p_ki^beta / t_k]``. -> (B,)

    The inner mean runs over all ``K`` samples (a sample where token ``i`` is unmasked adds 0), the
    outer one over tokens masked in at least one sample, as in the SPG code. Computed in log space.
    """
    K = token_logps.shape[0]
    v = beta * token_logps.float() - t.float().log()[..., None]  # (K, B, L)
    v = torch.where(masked, v, torch.full_like(v, -1e30))
    log_avg = torch.logsumexp(v, 0) - math.log(K)  # (B, L)
    hit = masked.any(0)  # (B, L)
    per_tok = torch.where(hit, log_avg, torch.zeros_like(log_avg))
    return per_tok.sum(-1) / hit.sum(-1).clamp_min(1) / beta  # (B,)


def sample_seeds(seeds: list[int], k: int) -> list[int]:
    """Seeds of Monte Carlo sample ``k``: sample 0 uses the caller's seeds unchanged."""
    return list(seeds) if k == 0 else [mix_seed(s, _SAMPLE_SALT, k) for s in seeds]




@LIKELIHOODS.register("elbo")
class ELBOEstimator(LikelihoodEstimator):
    config_class = ELBOConfig
    per_token = False
    cfg: ELBOConfig

    def draw(self, seeds: list[int], prompt_mask: torch.Tensor, completion_mask: torch.Tensor):
        """Masks for all ``K`` samples: prompt hits (K, B, P), completion masks (K, B, L), t (K, B).

        The completion masks are restricted to scored positions; ``scored`` (B, L) is returned too.
        """
        c = self.cfg
        B, P = prompt_mask.shape
        L = completion_mask.shape[1]
        dev = completion_mask.device
        scored = torch.ones_like(completion_mask, dtype=torch.bool) if c.score_after_eos else completion_mask.bool()
        n_draw = c.num_samples // 2 if c.antithetic else c.num_samples
        u = torch.stack([rand_rows(sample_seeds(seeds, k), 2 + P + L, dev)[0] for k in range(n_draw)])  # (n, B, W)
        t = c.t_min + (c.t_max - c.t_min) * u[..., 0]  # (n, B)
        u_blk, u_p, u_c = u[..., 1], u[..., 2:2 + P], u[..., 2 + P:]  # (n, B), (n, B, P), (n, B, L)
        sc = scored.expand_as(u_c)
        prompt_hit = (u_p < c.p_mask_prompt) & prompt_mask.bool()  # (n, B, P)
        if c.schedule == "block_random":
            pos = torch.arange(L, device=dev)
            n_blocks = torch.where(scored, pos, torch.full_like(pos, -1)).amax(-1) // c.block_length + 1  # (B,)
            blk = (u_blk * n_blocks).floor().long().clamp(max=n_blocks - 1)  # (n, B)
            pb = (pos // c.block_length)[None, None]  # (1, 1, L)
            in_blk = (pb == blk[..., None]) & sc
            masked = force_at_least_one((u_c < t[..., None]) & in_blk, in_blk, u_c) | ((pb > blk[..., None]) & sc)
            t = masked.sum(-1) / sc.sum(-1).clamp_min(1)  # empirical masking rate
            return prompt_hit, masked, t.float(), scored
        masked = force_at_least_one((u_c < t[..., None]) & sc, sc, u_c)  # (n, B, L)
        if not c.antithetic:
            return prompt_hit, masked, t, scored
        comp = sc & ~masked
        comp_forced = force_at_least_one(comp, sc, u_c, largest=True)
        moved = comp_forced & ~comp & (sc.sum(-1, keepdim=True) >= 2)  # token moved into the complement
        masked = masked & ~moved
        comp = comp | moved
        comp = torch.where(comp.any(-1, keepdim=True), comp, masked)  # single scored token: both mask it
        K = c.num_samples
        masked = torch.stack([masked, comp], 1).reshape(K, B, L)  # pairs (2m, 2m+1)
        t = torch.stack([t, 1 - t], 1).reshape(K, B)
        prompt_hit = torch.stack([prompt_hit, prompt_hit], 1).reshape(K, B, P)
        return prompt_hit, masked, t, scored

    def sample(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds,
               pinned=None) -> ELBOSample:
        """Draw the ``K`` masks and score them in one forward pass of ``K * B`` rows."""
        B, P = prompt_ids.shape
        L = completion_ids.shape[1]
        K = self.cfg.num_samples
        prompt_hit, masked, t, scored = self.draw(seeds, prompt_mask, completion_mask)
        noisy_prompt = torch.where(prompt_hit, self.mask_id, prompt_ids)  # (K, B, P)
        noisy_comp = show_pinned(torch.where(masked | ~scored, self.mask_id, completion_ids), completion_ids,
                                 pinned)  # (K, B, L); pinned tokens are context (the caller does not score them)
        ids = torch.cat([noisy_prompt, noisy_comp], -1).reshape(K * B, P + L)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_mask)], 1).repeat(K, 1)  # (K*B, P+L)
        logps = forward_logps(forward, ids, attn, completion_ids.repeat(K, 1), P,
                              select=masked.reshape(K * B, L)).view(K, B, L)  # only the masked tokens count
        return ELBOSample(logps, masked, t)

    def reduce(self, s: ELBOSample) -> torch.Tensor:
        """The ELBO of each row from a :meth:`sample`. -> (B,)"""
        return elbo_from_logps(s.token_logps, s.masked, s.t, self.cfg.weighting)

    def sampler_units(self, token_logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """The ELBO's reduction of per-token log-probs (B, L) with every scored token masked, t = 1. -> (B,)"""
        scored = torch.ones_like(completion_mask, dtype=torch.bool) if self.cfg.score_after_eos else completion_mask.bool()
        return elbo_from_logps(token_logp[None], scored[None], torch.ones_like(token_logp[None, :, 0]), self.cfg.weighting)

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        return self.reduce(self.sample(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned))
