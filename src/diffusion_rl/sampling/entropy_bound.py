"""The rules of DiffusionGemma's EntropyBound sampler (transformers' ``generation_diffusion_gemma.py``),
as pure functions of tensors; the loop that runs them is ``uniform_sampler.py``.

- *Temperature* (``LinearTemperatureScheduleLogitsProcessor``): the step counter ``n`` runs from ``N``
  (the first step) down to 1, and ``T_n = t_min + (t_max - t_min) * n / N``, computed in float32 as
  transformers does (``n`` an int32 tensor); the sampler draws from, takes entropies of and
  self-conditions on ``logits / T_n``. The last step's temperature is ``t_min + (t_max - t_min) / N``,
  not ``t_min``.
- *Acceptance* (``EntropyBoundSampler.accept_canvas``): sort the positions by the entropy of
  ``softmax(logits / T_n)``, ascending; accept the first ``k`` while ``sum_{i<=k} H_i - H_k <= bound``
  (the summed entropy minus the largest, an upper bound on the mutual information of the accepted
  tokens). The smallest entropy is always accepted. Accepted positions take the token drawn there;
  every other position is re-noised with a uniform random token. Nothing is frozen: a position
  accepted at one step is drawn again at the next and kept only if accepted again.
- *Stopping* (``StableAndConfidentStoppingCriteria``): a row stops denoising its canvas once its argmax
  canvas equals each of the previous ``stability_threshold`` steps' (never at the first step) and the
  mean entropy over its canvas is below ``confidence_threshold``; a stopped row is frozen while the
  others go on. The canvas written is the last argmax, not the last sampled canvas.

:class:`EntropyBoundConfig` (``sampler.uniform``) holds the released ``generation_config.json`` values
(transformers' defaults for this model are the same: tests/unit/sampling/test_uniform_sampler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError


@dataclass
class EntropyBoundConfig:
    """``sampler.uniform``: the EntropyBound sampler of a uniform-noise model (DiffusionGemma)."""

    steps: int = 48  # max_denoising_steps: the most steps per canvas (a canvas stops earlier when stable)
    entropy_bound: float = 0.1  # accept low-entropy positions while their summed entropy minus the largest <= this
    t_max: float = 0.8  # the temperature of the first step ...
    t_min: float = 0.4  # ... falling linearly towards this one (reached one step after the last)
    stability_threshold: int = 1  # steps the argmax canvas must repeat before a row may stop (0: no check)
    confidence_threshold: float = 0.005  # and the mean entropy below which it stops

    def validate(self, prefix: str = "sampler.uniform") -> None:
        if self.steps < 1:
            raise ConfigError(f"{prefix}.steps", self.steps, "must be >= 1")
        if not self.entropy_bound > 0:
            raise ConfigError(f"{prefix}.entropy_bound", self.entropy_bound, "must be > 0")
        if self.t_min < 0:
            raise ConfigError(f"{prefix}.t_min", self.t_min, "must be >= 0")
        if not self.t_max > self.t_min:
            raise ConfigError(f"{prefix}.t_max", self.t_max, f"must be > {prefix}.t_min={self.t_min}")
        if self.stability_threshold < 0:
            raise ConfigError(f"{prefix}.stability_threshold", self.stability_threshold, "must be >= 0")
        if not self.confidence_threshold > 0:
            raise ConfigError(f"{prefix}.confidence_threshold", self.confidence_threshold, "must be > 0")


def step_temperature(cfg: EntropyBoundConfig, remaining: int) -> torch.Tensor:
    """``T_n`` for the step with ``remaining = n`` steps left (``N`` at the first), a float32 scalar tensor
    computed as transformers computes it, so ``logits / T_n`` matches it bit for bit."""
    n = torch.tensor(remaining, dtype=torch.int32)
    return cfg.t_min + (cfg.t_max - cfg.t_min) * (n / cfg.steps)


def token_entropy(processed: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(processed)`` over the vocabulary, as transformers computes it. (B, C, V) -> (B, C)"""
    return torch.distributions.Categorical(logits=processed).entropy()


def accept_mask(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """The positions the entropy bound accepts. (B, C) -> (B, C) bool (see the module docstring)."""
    sorted_entropy, order = torch.sort(entropy, dim=-1, descending=False)
    keep = sorted_entropy.cumsum(-1) - sorted_entropy <= bound  # (B, C) in sorted order
    return torch.zeros_like(keep).scatter(-1, order, keep)


class StableAndConfident:
    """The stopping rule's state over one canvas (the argmax canvases of the last steps)."""

    def __init__(self, cfg: EntropyBoundConfig):
        self.stability, self.threshold = cfg.stability_threshold, cfg.confidence_threshold
        self.history: torch.Tensor | None = None  # (stability, B, C); -1 before any step

    def __call__(self, argmax: torch.Tensor, entropy: torch.Tensor, free: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) bool: rows stable and confident after a step whose argmax canvas is ``argmax`` (B, C) and
        whose per-position entropies are ``entropy`` (B, C); ``free`` (B, C) the positions the mean covers
        (pinned tokens left out; None: every position, as transformers)."""
        if self.stability == 0:
            stable = torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device)
        else:
            if self.history is None:
                self.history = torch.full((self.stability, *argmax.shape), -1, dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax[None]).all(-1).all(0)
            self.history = torch.roll(self.history, shifts=-1, dims=0)
            self.history[-1] = argmax
        if free is None:
            mean = entropy.mean(-1)
        else:
            mean = (entropy * free).sum(-1) / free.sum(-1).clamp_min(1)
        return stable & (mean < self.threshold)
