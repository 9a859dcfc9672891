"""GRPO's configuration edges and the tokens its KL anchor covers (rl/objectives/grpo.py)."""

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.policy import logits_fn
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.grpo import GRPO, GRPOConfig
from tests.helpers.common import make_batch, rollout_of


def test_grpo_config_edges():
    for ok in (dict(kl_tokens="ignored"), dict(kl_tokens="completion"), dict(agg="token-mean"),
               dict(eps=0.2, eps_high=0.28)):
        GRPOConfig(**ok).validate()
    for bad, key in ((dict(agg="mean"), "agg"), (dict(kl_tokens="all"), "kl_tokens"), (dict(eps=1.0), "eps"),
                     (dict(eps_high=0.0), "eps_high")):
        with pytest.raises(ConfigError, match=rf"^objective\.{key}\b"):
            GRPOConfig(**bad).validate()


@pytest.mark.parametrize("kl_tokens", ["completion", "ignored"])
def test_the_kl_anchor_covers_the_configured_tokens(tiny_bundle, kl_tokens):
    prompt, pmask, comp, cmask = make_batch(tiny_bundle, n=4)
    loss_mask = torch.zeros_like(cmask)
    loss_mask[:, :3] = 1  # the reward reads the first three tokens
    ro = rollout_of(prompt, pmask, comp, cmask, torch.zeros(4), torch.zeros(4), 4, loss_mask=loss_mask)
    net = tiny_bundle.net.eval()
    obj = GRPO(GRPOConfig(kl_tokens=kl_tokens, beta=0.04), OneStepEstimator(LikelihoodConfig(), tiny_bundle.mask_token_id))
    ctx = StepContext(ro, 0, 3, logits_fn(net), logits_fn(net), None)
    with torch.no_grad():
        units = obj.logp_units(ctx, logits_fn(net), "policy")
    expected = cmask * (1 - loss_mask) if kl_tokens == "ignored" else cmask
    assert torch.equal(units.kl_mask, expected)
    assert torch.equal(units.mask, ro.scored_mask)
