"""d1's one-step estimator (diffu-GRPO): mask the whole completion, one forward.

Every completion token is masked and each real prompt token is masked independently with
probability ``p_mask_prompt``; one forward pass gives per-token log-probs of the completion. d1 draws
one prompt mask per inner iteration for the whole batch; here each sample has its own generator
seeded from ``(rollout, sample, iteration)``, which keeps old/new masks identical all the same.
"""

from __future__ import annotations

import torch

from diffusion_rl.likelihood.base import (
    LIKELIHOODS,
    LikelihoodEstimator,
    forward_logps,
    mask_prompt,
    rand_rows,
    show_pinned,
)


@LIKELIHOODS.register("one_step")
class OneStepEstimator(LikelihoodEstimator):
    per_token = True

    def __call__(self, forward, prompt_ids, prompt_mask, completion_ids, completion_mask, seeds, pinned=None):
        B, P = prompt_ids.shape
        u = rand_rows(seeds, P, prompt_ids.device)[0]  # (B, P)
        noisy_prompt = mask_prompt(prompt_ids, prompt_mask, u, self.cfg.p_mask_prompt, self.mask_id)
        noisy = show_pinned(torch.full_like(completion_ids, self.mask_id), completion_ids, pinned)  # (B, L)
        ids = torch.cat([noisy_prompt, noisy], 1)  # (B, P+L)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1)
        return forward_logps(forward, ids, attn, completion_ids, P)  # (B, L)
