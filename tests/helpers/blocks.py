"""A block diffusion model's test batch and a bound staircase estimator, shared by the block sampler's
tests (tests/unit/sampling/test_block.py) and the staircase estimator's (tests/unit/likelihood/test_staircase.py).
The model itself is the ``block_bundle`` fixture (tests/conftest.py), of block size :data:`BS`."""

import torch

from diffusion_rl.likelihood.staircase import StaircaseConfig, StaircaseEstimator
from diffusion_rl.models.policy import encode_prompts

BS = 4


def block_data(bundle, prompts=("1203004000102300=", "12=", "3201="), L=16, eos_at=(None, 9, 3)):
    """Left-padded prompts (P whole blocks), random completions with an EOS at the given positions."""
    ids, mask = encode_prompts(bundle.tokenizer, list(prompts), pad_to_multiple_of=BS)
    g = torch.Generator().manual_seed(5)
    comp = torch.randint(5, 90, (len(prompts), L), generator=g)
    cmask = torch.ones(len(prompts), L)
    for r, e in enumerate(eos_at):
        if e is not None:
            comp[r, e:] = bundle.eos_token_id
            cmask[r, e + 1:] = 0
    return ids, mask, comp, cmask


def staircase_of(bundle, **kw):
    """A staircase estimator of ``StaircaseConfig(**kw)`` bound to ``bundle``."""
    est = StaircaseEstimator(StaircaseConfig(**kw), bundle.mask_token_id)
    est.bind(bundle)
    return est
