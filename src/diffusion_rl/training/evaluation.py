"""Greedy evaluation of a policy on a task's items, batched, with a progress bar."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from tqdm.auto import tqdm

from diffusion_rl.models.policy import PolicyBundle, decode_completions, encode_prompts
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.sampling.block import policy_generate


@torch.no_grad()
def generate_texts(bundle: PolicyBundle, prompts: list[str], sampler: SamplerConfig, batch_size: int,
                   generator: torch.Generator | None = None, desc: str | None = None) -> list[str]:
    net = bundle.net
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    out: list[str] = []
    starts = range(0, len(prompts), batch_size)
    for s in tqdm(starts, desc=desc, disable=desc is None, leave=False):
        ids, mask = encode_prompts(bundle.tokenizer, prompts[s : s + batch_size], device, bundle.block_size)
        res = policy_generate(net, bundle.block_size, ids, mask, sampler, bundle.mask_token_id, generator,
                              eos_id=bundle.eos_token_id)
        out += decode_completions(bundle.tokenizer, res.completion, bundle.eos_token_id)
    net.train(was_training)
    return out


def evaluate(bundle: PolicyBundle, task, items: list[dict[str, Any]], sampler: SamplerConfig,
             batch_size: int, desc: str | None = "evaluating") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy (``temperature = 0``) generations, the task's metrics, and one record per item."""
    greedy = replace(sampler, temperature=0.0)
    prompts = [task.prompt(it) for it in items]
    completions = generate_texts(bundle, prompts, greedy, batch_size, desc=desc)
    metrics = task.metrics(completions, items)
    rewards = task.rewards(completions, items).tolist()
    records = [{"prompt": p, "completion": c, "reward": r, **it}
               for p, c, r, it in zip(prompts, completions, rewards, items)]
    return metrics, records
