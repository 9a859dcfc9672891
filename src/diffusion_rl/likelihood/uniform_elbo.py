"""The ELBO of a uniform-state diffusion LM (DiffusionGemma), for objectives with sequence ratios
(StableDRL, ESPO, GRPO on sequences; docs/methods.md §3 "Uniform-state ELBO" derives it).

Forward process, per token, with ``alpha`` the probability of keeping the clean token: ``z ~ alpha
delta_x + (1 - alpha) Uniform(V)``. With ``xbar = V alpha onehot(x) + (1 - alpha)`` and, for the model's
prediction ``p = p_theta(x_0 | z)`` at a position, ``xbar_theta = V alpha p + (1 - alpha)``::

    log p(x) >= ELBO(x) = - sum_i int_0^1 (1 / (V alpha)) E_{z ~ q_alpha(. | x)} [ B_i(alpha, z) ] d alpha
    B_i = sum_{y != z_i} rho(y) phi(r(y) / rho(y)),  phi(s) = s - 1 - log s >= 0,
    rho(y) = xbar_y / xbar_{z_i},  r(y) = xbar_theta,y / xbar_theta,z_i

(UDLM's continuous-time bound, Schiff et al. 2024, written per vocabulary entry; it does not depend on
the noise schedule, only on ``alpha`` running from 0 to 1, so it is integrated in ``alpha``.) It is
exact -- ``ELBO = log p_data`` -- when ``p`` is the data's posterior of ``x_i`` given the *other* noisy
tokens: tests/unit/likelihood/test_uniform_elbo.py checks that by enumeration on a 3-token vocabulary.

Monte Carlo (``likelihood=uniform_elbo``): ``K`` draws per row of ``alpha ~ U(alpha_min, alpha_max)``
and of ``z``, each draw's ``- sum_i B_i / (V alpha)`` one forward of the decoder (no self-conditioning:
the first-step denoiser, whose generative process the bound is of) after the clean prompt and the
clean earlier canvases. Scored positions (the completion mask: up to and including the first EOS,
pinned tokens left out) are noised and scored; positions after the first EOS are pure noise and not
scored (as ``likelihood=elbo`` masks them); pinned tokens stay clean. Each draw of row ``b`` comes
from its own generator seeded ``sample_seeds(seeds, k)[b]`` (``likelihood/elbo.py``), so the old and
the new policy share the draws.

:func:`denoising_loss` is the warm start's supervised loss for such a model: cross-entropy of the clean
tokens at every free position of a canvas noised with ``alpha ~ U(0, 1)``, half the rows
self-conditioned on a first pass's prediction (transformers' ``self_conditioning_mask`` describes
this per-example training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LIKELIHOODS, LikelihoodConfig, LikelihoodEstimator
from diffusion_rl.likelihood.elbo import ELBOSample, sample_seeds


def phi_exp(u: torch.Tensor) -> torch.Tensor:
    """``phi(e^u) = e^u - 1 - u`` (>= 0), by its series where ``|u|`` is small (no cancellation)."""
    series = u * u * (0.5 + u * (1 / 6 + u * (1 / 24 + u / 120)))
    return torch.where(u.abs() < 1e-3, series, torch.expm1(u) - u)


def udlm_terms(logp: torch.Tensor, noisy: torch.Tensor, clean: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``B_i`` of the module docstring, >= 0. logp (..., V) the model's log p(x_0 | z) at each position,
    noisy and clean (...) tokens, alpha (...) -> (...)."""
    V = logp.shape[-1]
    a = alpha.to(logp.dtype)[..., None]  # (..., 1)
    log_keep, log_noise = torch.log(V * a + 1 - a), torch.log(1 - a)  # log xbar at x, and elsewhere
    log_xbar_theta = torch.logaddexp(torch.log(V * a) + logp, log_noise.expand_as(logp))  # (..., V)
    hit = torch.nn.functional.one_hot(clean, V).bool()
    log_xbar = torch.where(hit, log_keep.expand_as(logp), log_noise.expand_as(logp))  # (..., V)
    z = noisy[..., None]
    log_r = log_xbar_theta - log_xbar_theta.gather(-1, z)
    log_rho = log_xbar - log_xbar.gather(-1, z)
    return (log_rho.exp() * phi_exp(log_r - log_rho)).sum(-1)  # the y = z term is phi(1) = 0


@dataclass
class UniformELBOConfig(LikelihoodConfig):
    name: str = "uniform_elbo"
    p_mask_prompt: float = 0.0  # must be 0: the prompt is the encoder's clean context (no mask token)
    num_samples: int = 2  # K draws per row, one batched forward each canvas
    # alpha ~ U(alpha_min, alpha_max): the integrand vanishes at 0 and is finite at 1; the ends keep
    # log(1 - alpha) and 1 / alpha finite (the bound over [1e-3, 1 - 1e-3] differs from [0, 1] by ~1e-3 of it)
    alpha_min: float = 1e-3
    alpha_max: float = 1 - 1e-3
    # true: per-position terms (B, L) whose sum is the sequence ELBO (objective=espo); false: (B,)
    per_token: bool = False

    def validate(self) -> None:
        super().validate()
        if self.p_mask_prompt != 0:
            raise ConfigError("likelihood.p_mask_prompt", self.p_mask_prompt,
                              "must be 0 with uniform_elbo: the prompt is the encoder's clean context")
        if self.num_samples < 1:
            raise ConfigError("likelihood.num_samples", self.num_samples, "must be >= 1")
        if not 0 < self.alpha_min < self.alpha_max < 1:
            raise ConfigError("likelihood.alpha_max", self.alpha_max,
                              f"must satisfy 0 < alpha_min={self.alpha_min} < alpha_max < 1")


@LIKELIHOODS.register("uniform_elbo")
class UniformELBOEstimator(LikelihoodEstimator):
    """The Monte Carlo ELBO of the module docstring. ``sample`` / ``reduce`` as ``likelihood/elbo.py``'s
    (StableDRL reads them): ``token_logps`` holds each position's ``- B_i / (V alpha)``, ``masked`` the
    scored positions, ``t`` the noise rate ``1 - alpha``."""

    config_class = UniformELBOConfig
    cfg: UniformELBOConfig
    per_token = False  # by default; per position with likelihood.per_token=true (set per instance)

    def __init__(self, cfg: UniformELBOConfig, mask_id: int):
        super().__init__(cfg, mask_id)
        self.per_token = cfg.per_token

    def bind(self, bundle) -> None:
        if bundle.noise != "uniform":
            raise ConfigError("likelihood.name", self.cfg.name,
                              "is the ELBO of a uniform-noise model (model=diffusion_gemma); a masked model takes elbo")

    def draw(self, seeds: list[int], scored: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """alpha (K, B), which positions keep their token (K, B, L) and the random tokens (K, B, L)."""
        c, (B, L) = self.cfg, scored.shape
        alpha, keep, tokens = torch.empty(c.num_samples, B), torch.empty(c.num_samples, B, L), torch.empty(
            c.num_samples, B, L, dtype=torch.long)
        for k in range(c.num_samples):
            for b, s in enumerate(sample_seeds(seeds, k)):
                g = torch.Generator().manual_seed(s)
                alpha[k, b] = c.alpha_min + (c.alpha_max - c.alpha_min) * torch.rand((), generator=g)
                keep[k, b] = torch.rand(L, generator=g)
                tokens[k, b] = torch.randint(0, V, (L,), generator=g)
        dev = scored.device
        kept = (keep.to(dev) < alpha.to(dev)[..., None]) & scored  # after the first EOS: never kept
        return alpha.to(dev), kept, tokens.to(dev)

    def sample(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds,
               pinned=None) -> ELBOSample:
        """Draw the ``K`` noisy completions and score them, one forward per canvas with a scored position."""
        net = forward.net
        C, V, K = int(net.canvas_length), int(net.vocab_size), self.cfg.num_samples
        B, L = completion_ids.shape
        scored = completion_mask.bool() if pinned is None else completion_mask.bool() & ~pinned
        alpha, kept, tokens = self.draw(seeds, scored, V)
        noisy = torch.where(kept, completion_ids, tokens)  # (K, B, L)
        if pinned is not None:
            noisy = torch.where(pinned, completion_ids, noisy)
        terms = torch.zeros(K, B, L, device=completion_ids.device)
        for k in range(L // C):
            span = slice(k * C, (k + 1) * C)
            if not bool(scored[:, span].any()):
                continue
            ctx = torch.cat([prompt_ids, completion_ids[:, :k * C]], 1).repeat(K, 1)
            mask = torch.cat([prompt_mask, torch.ones_like(completion_ids[:, :k * C])], 1).repeat(K, 1)
            logits = forward.run(input_ids=ctx, attention_mask=mask, canvas=noisy[:, :, span].reshape(K * B, C)).logits
            b = udlm_terms(logits.float().log_softmax(-1), noisy[:, :, span].reshape(K * B, C),
                           completion_ids[:, span].repeat(K, 1), alpha.reshape(K * B, 1).expand(-1, C))  # (K*B, C)
            terms[:, :, span] = -(b / (V * alpha.reshape(K * B, 1))).view(K, B, C)
        sel = scored.expand(K, B, L)
        return ELBOSample(torch.where(sel, terms, torch.zeros_like(terms)), sel, 1 - alpha)

    def reduce(self, s: ELBOSample) -> torch.Tensor:
        """The sequence ELBO of each row. -> (B,)"""
        return torch.where(s.masked, s.token_logps, torch.zeros_like(s.token_logps)).sum(-1).mean(0)

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        s = self.sample(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned)
        return s.token_logps.mean(0) if self.per_token else self.reduce(s)


def denoising_loss(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_ids: torch.Tensor,
                   generator: torch.Generator, pinned: torch.Tensor | None = None,
                   self_conditioned: float = 0.5) -> torch.Tensor:
    """Mean cross-entropy of the clean tokens at the free positions of uniformly noised canvases (see the
    module docstring); ``self_conditioned`` of the rows see a first pass's prediction (no gradient)."""
    net = forward.net
    C, V = int(net.canvas_length), int(net.vocab_size)
    B, L = target_ids.shape
    dev = target_ids.device
    alpha = torch.rand(B, 1, generator=generator).to(dev)
    noisy = torch.where(torch.rand(B, L, generator=generator).to(dev) < alpha, target_ids,
                        torch.randint(0, V, (B, L), generator=generator).to(dev))
    free = torch.ones_like(target_ids, dtype=torch.bool) if pinned is None else ~pinned
    noisy = torch.where(free, noisy, target_ids)
    conditioned = (torch.rand(B, generator=generator) < self_conditioned).to(dev)
    total, count = target_ids.new_zeros((), dtype=torch.float32), 0
    for k in range(math.ceil(L / C)):
        span = slice(k * C, (k + 1) * C)
        ctx = torch.cat([prompt_ids, target_ids[:, :k * C]], 1)
        mask = torch.cat([prompt_mask, torch.ones_like(target_ids[:, :k * C])], 1)
        call = {"input_ids": ctx, "attention_mask": mask, "canvas": noisy[:, span]}
        signal = None
        if bool(conditioned.any()):
            with torch.no_grad():
                signal = forward.run(**call, soft_temperature=1.0).soft * conditioned[:, None, None]
        logits = forward.run(**call, self_conditioning=signal).logits  # (B, C, V)
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target_ids[:, span], reduction="none")
        total = total + (ce * free[:, span]).sum()
        count += int(free[:, span].sum())
    return total / max(count, 1)
