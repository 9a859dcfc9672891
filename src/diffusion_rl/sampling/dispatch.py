"""One way in to the samplers: :func:`sample` runs the one a policy needs.

A uniform-noise model (``PolicyBundle.noise == "uniform"``: DiffusionGemma) runs its EntropyBound
sampler (``uniform_sampler.py``). A block model (``PolicyBundle.block_size > 0``) fills its blocks left
to right with the block sampler (``block.py``), over its exact key/value cache where the network has
one; any other model runs the masked-diffusion sampler (``sampler.py``, with ``sampler.kv_cache`` on the network). Rollouts, tree
rollouts, IGPO's hinted resamples (through the rollout engine), evaluation and the benchmarks call
this function, so none of them decides which sampler a model takes.
"""

from __future__ import annotations

import torch
from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import PolicyBundle, logits_fn
from diffusion_rl.sampling.block import block_generate
from diffusion_rl.sampling.noise import RowNoise
from diffusion_rl.sampling.sampler import SampleOutput, SamplerConfig, StepRecorder, generate
from diffusion_rl.sampling.uniform_sampler import entropy_bound_generate
from diffusion_rl.sampling.uniform_trajectory import UniformTrajectory


def sample(bundle: PolicyBundle, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, cfg: SamplerConfig,
           noise: RowNoise | None = None, recorder: StepRecorder | UniformTrajectory | None = None, *,
           net: nn.Module | None = None,
           canvas: torch.Tensor | None = None, start_step: int = 0, stop_step: int | None = None) -> SampleOutput:
    """Completions of ``prompt_ids`` (B, P) by the sampler ``bundle``'s model needs, with its mask and
    EOS ids. ``net``: the network to sample with (a frozen old-policy copy), else ``bundle.net``;
    ``canvas`` (B, L): pinned tokens; ``start_step`` / ``stop_step``: a part of the masked-diffusion
    sampler's schedule (:func:`~diffusion_rl.sampling.sampler.generate`; tree rollouts)."""
    net = bundle.net if net is None else net
    if bundle.noise == "uniform":  # no mask token: DiffusionGemma's EntropyBound sampler (uniform_sampler.py)
        if (start_step, stop_step) != (0, None):
            raise ValueError("a part of the schedule (start_step / stop_step) runs in the masked-diffusion sampler only")
        assert recorder is None or isinstance(recorder, UniformTrajectory), "a uniform-noise sampler records whole steps"
        return entropy_bound_generate(net, prompt_ids, prompt_mask, cfg, noise, recorder,
                                      eos_id=bundle.eos_token_id, canvas=canvas, free_id=bundle.mask_token_id)
    assert not isinstance(recorder, UniformTrajectory), "a masking sampler records with TrajectoryRecorder"
    if bundle.block_size > 0:
        if (start_step, stop_step) != (0, None):
            raise ValueError("a part of the schedule (start_step / stop_step) runs in the masked-diffusion sampler only")
        return block_generate(net, prompt_ids, prompt_mask, cfg, bundle.block_size, bundle.mask_token_id, noise,
                              recorder, use_cache=getattr(net, "supports_kv_cache", False),
                              eos_id=bundle.eos_token_id, canvas=canvas)
    if cfg.editing_threshold is not None:
        raise ConfigError("sampler.editing_threshold", cfg.editing_threshold,
                          "token editing runs in the block sampler: it needs a block model (model.block_size > 0)")
    return generate(logits_fn(net), prompt_ids, prompt_mask, cfg, bundle.mask_token_id, noise, recorder, net=net,
                    eos_id=bundle.eos_token_id, canvas=canvas, start_step=start_step, stop_step=stop_step)
