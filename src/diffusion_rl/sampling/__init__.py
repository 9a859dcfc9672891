"""Rollout samplers for diffusion LMs."""

from diffusion_rl.sampling.noise import RowNoise
from diffusion_rl.sampling.sampler import (
    SampleOutput,
    SamplerConfig,
    StepRecorder,
    generate,
    num_transfer_tokens,
)

__all__ = ["RowNoise", "SamplerConfig", "SampleOutput", "StepRecorder", "generate", "num_transfer_tokens"]
