"""``K`` masked copies of each sequence whose mask counts are spread evenly over ``1..n`` (BGPO's
estimator), scored one copy per forward so that memory does not grow with ``K``.

Row ``b`` has ``n_b`` scored positions (the ``completion_mask`` the caller passes). One offset
``k_b`` uniform on ``1..n_b`` per row spreads the counts of its ``K`` copies over ``1..n_b``, and copy
``j`` masks a uniformly random subset of that size::

    x_bj = ((round(linspace(k_b, k_b + (K - 1) n_b / K, K)[j]) - 1) mod n_b) + 1     (float32, as DARE)
    E_bj = (n_b / x_bj) * sum_{i masked in copy j} log p_theta(x_i | copy j)
    ELBO_b = mean_j E_bj

``E_bj`` is LLaDA's ``1/t`` bound with ``t = x_bj / n_b``: each copy is an unbiased estimate of the
discrete masked-diffusion ELBO when ``x`` is uniform on ``1..n``, and the even spread keeps the ``K``
copies of a row from bunching at a few masking rates. :meth:`EvenCountsEstimator.sample` returns every
copy's token log-probs (an :class:`~diffusion_rl.likelihood.elbo.ELBOSample` with ``t = x / n``), or
those of the ``copies`` asked for: ``objective=bgpo`` scores one copy at a time with gradients and
backpropagates it before the next (``rl/objectives/bgpo.py``).

Source: DARE (yjyddq/DARE @ 83ae8a3), ``verl/trainer/ppo/dllm_core_algos.py`` ``_forward_process_bgpo``
(L593-631: ``k = randint(1, target_len + 1)``, the ``linspace`` and its wrap, a ``randperm`` per copy,
``p_mask = x / target_len``), called once per sequence with its ``n_l`` copies
(``verl/workers/dllm_fsdp_workers.py`` L1152-1223; ``n_l = mc_num = 16`` in every BGPO recipe, so the
``K`` copies share one offset), and ``verl/workers/actor/llada_dp_actor_bgpo.py`` ``_forward_micro_batch``
(L93-122: the sum over masked tokens of ``log p / p_mask``). Choices and deviations:

- *Local generators.* DARE draws ``k`` and the permutations from the global generator at rollout time;
  here row ``b`` draws its offset, its prompt mask and each copy's subset (the ``x_bj`` scored
  positions with the smallest uniform keys: the same distribution as ``randperm(n)[:x]``) from one
  generator seeded with its mask seed (``mask_seeds``), so the old and the new policy share them.
- *Rounding ties*, kept as DARE computes them: a copy whose shift ``j n / K`` is a half-integer rounds
  half to even, so its count is not uniform over the offset (``n = 5, K = 4``: copy 2 masks 4, 4, 1, 1
  or 3 positions for ``k = 1..5``) and its estimate is slightly biased; the shifts are integers when ``K``
  divides ``n`` (DARE's ``L = 256``, ``K = 16``).
- *Scored positions.* DARE's LLaDA rollout marks every generated position as response (its attention
  mask is all ones after the prompt), so ``n_b = L`` there; the caller decides here
  (``objective.elbo_tokens``). Positions outside the caller's mask are masked in every copy and never
  scored (an attention mask ending at EOS would drop them from DARE's packed input), and pinned
  positions are context.
- ``p_mask_prompt`` (default 0: DARE never masks the prompt) masks each real prompt token with that
  probability, the same mask in every copy. The rollout's attention mask is passed; fp32 (DARE: bf16
  autocast).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodConfig,
    LikelihoodEstimator,
    forward_logps,
    rand_rows,
    show_pinned,
)
from diffusion_rl.likelihood.elbo import ELBOSample
from diffusion_rl.likelihood.stratified import subset_of_size


@dataclass
class EvenCountsConfig(LikelihoodConfig):
    name: str = "even_counts"
    p_mask_prompt: float = 0.0  # DARE never masks the prompt
    num_samples: int = 16  # K copies per sequence: DARE's mc_num (= n_l) in every BGPO recipe

    def validate(self) -> None:
        super().validate()
        if self.num_samples < 1:
            raise ConfigError("likelihood.num_samples", self.num_samples, "must be >= 1")


@dataclass
class EvenCountsDraw:
    prompt_hit: torch.Tensor  # (B, P) bool, the same in every copy
    offset: torch.Tensor  # (B,) long, k_b in 1..n_b (0 for a row with nothing to score)
    counts: torch.Tensor  # (K, B) long, x_bj in 1..n_b (0 for a row with nothing to score)
    keys: torch.Tensor  # (K, B, L) uniform keys: copy j masks the x_bj scored positions with the smallest
    masked: torch.Tensor  # (K, B, L) bool, scored positions only


def even_counts(k: int, n: int, K: int) -> torch.Tensor:
    """The ``K`` mask counts of a row with ``n >= 1`` scored positions and offset ``k`` in ``1..n``,
    spread evenly over ``1..n``: a float32 ``linspace`` rounded half to even and wrapped, as DARE
    builds it. -> (K,) long"""
    start = torch.tensor(k)  # a long 0-d tensor: the end below is then float32, as DARE computes it
    x = torch.round(torch.linspace(float(k), start + (K - 1) * (n / K), steps=K)).long()
    return (x - 1) % n + 1


def copy_estimates(s: ELBOSample) -> torch.Tensor:
    """Each copy's ``(n / x) * sum of its masked log-probs``, summed token by token as DARE's
    ``log p / p_mask``. (K, B, L) -> (K, B); 0 for a row with nothing masked."""
    t = s.t.clamp_min(1e-12)[..., None]  # (K, B, 1) x / n
    return torch.where(s.masked, s.token_logps / t, torch.zeros_like(s.token_logps)).sum(-1)


@LIKELIHOODS.register("even_counts")
class EvenCountsEstimator(LikelihoodEstimator):
    config_class = EvenCountsConfig
    per_token = False
    cfg: EvenCountsConfig

    def draw(self, seeds: list[int], prompt_mask: torch.Tensor, scored: torch.Tensor) -> EvenCountsDraw:
        """Every copy's mask: row ``b``'s numbers (offset, prompt, each copy's keys) all come from
        ``seeds[b]``'s generator. scored (B, L) bool."""
        K, (B, P), L = self.cfg.num_samples, prompt_mask.shape, scored.shape[1]
        u = rand_rows(seeds, 1 + P + L, scored.device, k=K)  # (K, B, 1 + P + L)
        n = scored.sum(-1)  # (B,)
        offset = torch.minimum((u[0, :, 0].double() * n).floor().long() + 1, n)  # (B,) uniform on 1..n
        counts = torch.zeros(K, B, dtype=torch.long, device=scored.device)
        for b in range(B):
            if int(n[b]) > 0:
                counts[:, b] = even_counts(int(offset[b]), int(n[b]), K).to(scored.device)
        hit = (u[0, :, 1:1 + P] < self.cfg.p_mask_prompt) & prompt_mask.bool()  # (B, P)
        keys = u[..., 1 + P:]  # (K, B, L)
        return EvenCountsDraw(hit, offset, counts, keys, subset_of_size(keys, scored.expand(K, B, L), counts))

    def sample(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None,
               copies: list[int] | None = None) -> ELBOSample:
        """The token log-probs of the ``copies`` asked for (default: all ``K``), one forward of ``B`` rows
        per copy. -> token_logps, masked (C, B, L) and t = x / n (C, B)"""
        scored = completion_mask.bool()
        d = self.draw(seeds, prompt_mask, scored)
        copies = list(range(self.cfg.num_samples)) if copies is None else copies
        prompt = torch.where(d.prompt_hit, self.mask_id, prompt_ids)  # (B, P)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1)  # (B, P + L)
        logps = []
        for j in copies:
            noisy = show_pinned(torch.where(d.masked[j] | ~scored, self.mask_id, completion_ids), completion_ids,
                                pinned)  # (B, L)
            logps.append(forward_logps(forward, torch.cat([prompt, noisy], 1), attn, completion_ids,
                                       prompt_ids.shape[1], select=d.masked[j]))  # (B, L), 0 where not masked
        n = scored.sum(-1).clamp_min(1).to(torch.float32)  # (B,)
        t = d.counts[copies].to(torch.float32) / n  # (C, B)
        return ELBOSample(torch.stack(logps), d.masked[copies], t)

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        """The mean of the ``K`` copies' estimates. -> (B,)"""
        s = self.sample(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned)
        return copy_estimates(s).mean(0)

    def sampler_units(self, token_logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """The sampler's log-probability of the scored tokens, their sum (every one masked: t = 1). -> (B,)"""
        return torch.where(completion_mask.bool(), token_logp, torch.zeros_like(token_logp)).sum(-1)
