"""A tiny DiffusionGemma for the uniform-noise tests, and transformers' ``generate`` run as our sampler runs.

``sharp_gemma`` multiplies the (tied) embeddings so that the random model is confident: its sampler then
accepts several positions a step and rows stop early, which a near-uniform random model never does."""

from __future__ import annotations

import torch

from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, PolicyBundle
from diffusion_rl.sampling.entropy_bound import EntropyBoundConfig


def sharp_gemma(canvas: int = 8, scale: float = 60.0, seed: int = 0, d_model: int = 32) -> PolicyBundle:
    """``model=diffusion_gemma_tiny`` (2 layers: one sliding, one full) with embeddings times ``scale``."""
    torch.manual_seed(seed)
    b = build_policy(ModelConfig(name="diffusion_gemma_tiny", d_model=d_model, n_layers=2, n_heads=4,
                                 block_size=canvas))
    with torch.no_grad():
        b.net.model.model.decoder.embed_tokens.weight.mul_(scale)
    return b


#: an EntropyBound sampler that accepts several positions a step on :func:`sharp_gemma` and stops early
EB = EntropyBoundConfig(steps=5, entropy_bound=1.0, confidence_threshold=0.5)


def uniform_rollout(bundle: PolicyBundle, ids: torch.Tensor, mask: torch.Tensor | None, seeds: list[int],
                    gen_length: int = 16):
    """Our EntropyBound sampler (:data:`EB`) on ``ids`` with its trajectory recorded -> (trajectory, completions)."""
    from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
    from diffusion_rl.sampling.uniform_trajectory import UniformTrajectory

    traj = UniformTrajectory()
    out = sample(bundle, ids, mask, SamplerConfig(gen_length=gen_length, uniform=EB), RowNoise(seeds), traj)
    return traj, out.completion


def hf_generate(bundle: PolicyBundle, ids: torch.Tensor, mask: torch.Tensor | None, eb: EntropyBoundConfig,
                gen_length: int, seed: int) -> torch.Tensor:
    """transformers' ``generate`` after ``torch.manual_seed(seed)`` with ``eb``'s settings and the bundle's EOS
    (pad 0): the completions (B, gen_length), padding after the end as transformers writes it."""
    from transformers import EntropyBoundSamplerConfig

    torch.manual_seed(seed)
    extra = {} if mask is None else {"attention_mask": mask}
    out = bundle.net.model.generate(ids, max_new_tokens=gen_length, max_denoising_steps=eb.steps,
                                    sampler_config=EntropyBoundSamplerConfig(entropy_bound=eb.entropy_bound),
                                    t_min=eb.t_min, t_max=eb.t_max, stability_threshold=eb.stability_threshold,
                                    confidence_threshold=eb.confidence_threshold, eos_token_id=bundle.eos_token_id,
                                    pad_token_id=0, **extra)
    return out.sequences[:, ids.shape[1]:]


def up_to_eos(row: list[int], eos: int) -> list[int]:
    """A completion's tokens up to and including its first EOS (what the rollout reads)."""
    return row[: row.index(eos) + 1] if eos in row else row
