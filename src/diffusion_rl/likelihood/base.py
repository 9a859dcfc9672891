"""The estimator interface and the local random generators that draw masks.

Masks come from a ``torch.Generator`` per row seeded from ``(rollout id, sample, inner iteration)``
and never from the global seed, so the old and the new policy see identical masks, and a resumed run
draws the same masks as an uninterrupted one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.registry import Registry
from diffusion_rl.core.seeding import mix_seed

LIKELIHOODS: Registry[type[LikelihoodEstimator]] = Registry("likelihood.name")



def mask_seeds(run_seed: int, rollout_id: int, num_samples: int, inner_iter: int, offset: int = 0) -> list[int]:
    """One seed per sample of a rollout batch for one inner iteration.

    ``offset`` is the global index of the first sample (a process's share of a data-parallel batch),
    so a sample draws the same masks whatever the number of processes."""
    return [mix_seed(run_seed, rollout_id, j, inner_iter) for j in range(offset, offset + num_samples)]


def rand_rows(seeds: list[int], width: int, device: torch.device | str = "cpu", k: int = 1) -> torch.Tensor:
    """Uniform numbers ``(k, B, width)``: row ``b`` drawn from its own generator ``seeds[b]``.

    Drawn on the CPU so the same seed gives the same mask on any device.
    """
    out = torch.empty(len(seeds), k, width)
    for b, s in enumerate(seeds):
        out[b] = torch.rand(k, width, generator=torch.Generator().manual_seed(s))
    return out.transpose(0, 1).to(device)  # (k, B, width)


def batch_seed(seeds: list[int], salt: int) -> int:
    """One seed for a draw that the rows of a call share (a batch-level masking rate or count offset, as
    coupled-GRPO and ESPO draw them), mixed from every row's seed: the same rows and inner iteration
    give the same draw, so the old and the new policy share it as they share the per-row masks, and
    fresh masks (``share_masks_with_old=false``) change it with them."""
    return mix_seed(salt, *seeds)


def batch_uniform(seeds: list[int], salt: int) -> float:
    """A uniform number in ``[0, 1)`` from :func:`batch_seed`'s local generator."""
    return float(torch.rand((), generator=torch.Generator().manual_seed(batch_seed(seeds, salt))))


@dataclass
class LikelihoodConfig:
    name: str = "one_step"
    p_mask_prompt: float = 0.15  # probability of masking each prompt token (d1)

    def validate(self) -> None:
        if not 0.0 <= self.p_mask_prompt < 1.0:
            raise ConfigError("likelihood.p_mask_prompt", self.p_mask_prompt, "must be in [0, 1)")


class LikelihoodEstimator(ABC):
    """``(forward, prompt, completion, seeds) -> log-likelihood proxy``.

    ``per_token`` estimators return ``(B, L)`` log-probs of completion tokens; sequence-level ones
    return ``(B,)``.
    """

    config_class: type[LikelihoodConfig] = LikelihoodConfig
    per_token: bool = True

    def __init__(self, cfg: LikelihoodConfig, mask_id: int):
        cfg.validate()
        self.cfg = cfg
        self.mask_id = mask_id

    def bind(self, bundle) -> None:  # noqa: B027 - a deliberate no-op hook, not abstract
        """Check the estimator fits the policy (a :class:`PolicyBundle`) and read what it needs from it.

        Called once at build time, before any work; estimators that work with any model keep this no-op.
        """

    def sampler_units(self, token_logp: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """A sampler's per-token log-probabilities of a completion (B, L) in this estimator's units:
        per token (B, L) here; sequence-level estimators reduce them as they reduce their own
        (``rl/objectives/behaviour.py`` says what is comparable)."""
        if not self.per_token:
            raise NotImplementedError(f"{type(self).__name__} must say how a sampler's log-probs reduce to its units")
        return token_logp

    @abstractmethod
    def __call__(
        self,
        forward,  # (ids, attention_mask) -> logits (B, T, V)
        prompt_ids: torch.Tensor,  # (B, P)
        prompt_mask: torch.Tensor,  # (B, P)
        completion_ids: torch.Tensor,  # (B, L)
        completion_mask: torch.Tensor,  # (B, L) the tokens to score
        seeds: list[int],
        pinned: torch.Tensor | None = None,  # (B, L) bool: the task's known tokens, always visible, never scored
    ) -> torch.Tensor: ...


def token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax. (B, L, V) -> (B, L)."""
    logits = logits.float()
    return logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1)


def forward_logps(forward, ids: torch.Tensor, attn: torch.Tensor | None, targets: torch.Tensor, start: int,
                  select: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``log p(targets)`` at positions ``start .. start + L`` of one forward over ``ids``, fp32.

    ids (B, T), targets (B, L) -> (B, L). ``select`` (B, L) bool names the positions the caller
    reads; the others hold 0. Every estimator scores through this one call, so a forward that can
    compute its output head at the needed positions alone (``forward.token_logps``) does so here.
    """
    score = getattr(forward, "token_logps", None)
    if score is not None:
        return score(ids, attn, targets, start=start, select=select, position_ids=position_ids)
    logits = forward(ids, attn) if position_ids is None else forward(ids, attn, position_ids)  # (B, T, V)
    out = token_logps(logits[:, start:start + targets.shape[1]], targets)  # (B, L)
    return out if select is None else out.masked_fill(~select, 0.0)


def show_pinned(noisy: torch.Tensor, clean: torch.Tensor, pinned: torch.Tensor | None) -> torch.Tensor:
    """A noisy completion (..., B, L) with the task's pinned positions (B, L) holding their tokens: a
    pinned token is context, never masked (``Task.pinned_completion``)."""
    return noisy if pinned is None else torch.where(pinned, clean, noisy)


def unpinned(select: torch.Tensor, pinned: torch.Tensor | None) -> torch.Tensor:
    """``select`` (..., B, L) without the pinned positions (B, L): a pinned token is never scored."""
    return select if pinned is None else select & ~pinned


def mask_prompt(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, u: torch.Tensor, p: float,
                mask_id: int) -> torch.Tensor:
    """Replace real prompt tokens where ``u < p`` by the mask token (padding stays padding)."""
    hit = (u < p) & prompt_mask.bool()
    return torch.where(hit, torch.full_like(prompt_ids, mask_id), prompt_ids)


def force_at_least_one(mask: torch.Tensor, allowed: torch.Tensor, key: torch.Tensor, largest: bool = False) -> torch.Tensor:
    """Where a row of ``mask`` is empty, set its allowed position with the smallest (largest) key."""
    fill = float("-inf") if largest else float("inf")
    k = torch.where(allowed, key, torch.full_like(key, fill))
    idx = k.argmax(-1) if largest else k.argmin(-1)
    pick = torch.zeros_like(mask).scatter_(-1, idx[..., None], True) & allowed
    empty = ~mask.any(-1, keepdim=True)
    return mask | (pick & empty)
