"""Rollout samplers for diffusion LMs; :func:`sample` runs the one a policy needs (``dispatch.py``)."""

from diffusion_rl.sampling.dispatch import sample
from diffusion_rl.sampling.noise import RowNoise
from diffusion_rl.sampling.sampler import (
    SampleOutput,
    SamplerConfig,
    StepRecorder,
    generate,
    num_transfer_tokens,
)

__all__ = ["RowNoise", "SamplerConfig", "SampleOutput", "StepRecorder", "generate", "num_transfer_tokens", "sample"]
