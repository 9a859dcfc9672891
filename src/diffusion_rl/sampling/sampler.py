"""The low-confidence remasking sampler of LLaDA (SPEC §2), batched over prompts x group size.

Start from ``[prompt, MASK * gen_length]``; the completion is cut into blocks of ``block_length``
filled left to right, each with ``steps / num_blocks`` denoising steps. At each step one forward pass
gives logits; a candidate token is drawn at every masked position (Gumbel-max at temperature ``tau``,
plain argmax at ``tau = 0``); the ``k`` most confident candidates inside the current block are
committed. ``k`` follows :func:`num_transfer_tokens`.

One step (candidates, confidence, the ``k`` committed) is :func:`denoise_step`, shared with the block
sampler (``block.py``). A :class:`StepRecorder` passed to :func:`generate` sees every step's state,
logits and committed positions, so per-step trajectories (EGSPO) are recorded from the forward pass
the sampler already makes. Every sampler also returns, per sample, the mean full-vocabulary entropy
of the distributions its committed tokens were drawn from (temperature 1: ``train/entropy``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from diffusion_rl.errors import ConfigError

Forward = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]  # (ids, attn) -> logits


@dataclass
class SamplerConfig:
    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 0.9  # tau; 0 = greedy
    remasking: str = "low_confidence"  # or "random"
    cfg_scale: float = 0.0  # classifier-free guidance (LLaDA); 0 = off
    gumbel_dtype: str = "float64"  # float64 as LLaDA; float32 is faster and nearly the same
    # rows per sampler call in training rollouts (0 = a process's whole share): bounds memory on big
    # models; each call draws its noise from a generator keyed by its first global row, so runs on
    # 1 and on W processes match when both use the same value (e.g. rows per process)
    rollout_batch_size: int = 0

    def validate(self, prefix: str = "sampler") -> None:
        for key in ("gen_length", "block_length", "steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{prefix}.{key}", getattr(self, key), "must be >= 1")
        if self.gen_length % self.block_length:
            raise ConfigError(
                f"{prefix}.gen_length", self.gen_length,
                f"must be divisible by {prefix}.block_length={self.block_length}",
            )
        num_blocks = self.gen_length // self.block_length
        if self.steps % num_blocks:
            raise ConfigError(
                f"{prefix}.steps", self.steps,
                f"must be divisible by the number of blocks gen_length/block_length={num_blocks}",
            )
        if self.steps > self.gen_length:
            raise ConfigError(f"{prefix}.steps", self.steps, f"must be <= gen_length={self.gen_length}")
        if self.temperature < 0:
            raise ConfigError(f"{prefix}.temperature", self.temperature, "must be >= 0")
        if self.remasking not in ("low_confidence", "random"):
            raise ConfigError(f"{prefix}.remasking", self.remasking, "allowed: low_confidence, random")
        if self.cfg_scale < 0:
            raise ConfigError(f"{prefix}.cfg_scale", self.cfg_scale, "must be >= 0")
        if self.rollout_batch_size < 0:
            raise ConfigError(f"{prefix}.rollout_batch_size", self.rollout_batch_size, "must be >= 0 (0 = all rows at once)")
        if self.gumbel_dtype not in ("float64", "float32"):
            raise ConfigError(f"{prefix}.gumbel_dtype", self.gumbel_dtype, "allowed: float64, float32")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks


class StepRecorder(Protocol):
    """Receives every denoising step; must not modify its arguments."""

    def on_step(
        self,
        step: int,
        x_before: torch.Tensor,  # (B, T) state before the step
        logits: torch.Tensor,  # (B, T, V) of that state
        candidates: torch.Tensor,  # (B, T) drawn tokens
        committed: torch.Tensor,  # (B, T) bool, positions committed at this step
    ) -> None: ...


@dataclass
class SampleOutput:
    sequences: torch.Tensor  # (B, P + L) prompt and completion
    completion: torch.Tensor  # (B, L)
    # sum over the committed tokens of a row of the entropy of softmax(logits) at their position, and
    # their number: (B,) each; train/entropy is sum / count over the batch
    entropy_sum: torch.Tensor | None = None
    num_committed: torch.Tensor | None = None


class CommitStats:
    """Per-row sums over committed tokens, accumulated step by step (what :class:`SampleOutput` reports)."""

    def __init__(self, batch: int, device: torch.device):
        self.entropy_sum = torch.zeros(batch, dtype=torch.float64, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)

    def add(self, logits: torch.Tensor, commit: torch.Tensor) -> None:
        """logits (B, T, V) and commit (B, T) bool of one step."""
        rows = commit.nonzero()[:, 0]  # (n,)
        logp = logits[commit].float().log_softmax(-1)  # (n, V)
        ent = -(logp.exp() * logp).sum(-1)  # (n,)
        self.entropy_sum.index_add_(0, rows, ent.double())
        self.count += commit.sum(-1)

    def finish(self, sequences: torch.Tensor, completion: torch.Tensor) -> SampleOutput:
        return SampleOutput(sequences, completion, self.entropy_sum, self.count)


def num_transfer_tokens(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit per step: ``m // n`` each, the remainder one each over the first steps.

    masked: (B,) masked-token counts of the block -> (B, steps) int64
    """
    base = (masked // steps)[:, None]  # (B, 1)
    rem = (masked % steps)[:, None]  # (B, 1)
    idx = torch.arange(steps, device=masked.device)[None, :]  # (1, steps)
    return (base + (idx < rem).long()).long()


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``argmax(logits / tau + Gumbel)``; plain argmax at ``tau = 0``. logits (B, T, V) -> (B, T)."""
    if temperature == 0:
        return logits.argmax(-1)
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=dtype)
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(dtype).tiny)))
    return (logits.to(dtype) / temperature + gumbel).argmax(-1)


def top_k_per_row(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean (B, T) selecting the ``k[b]`` largest entries of each row of ``confidence``."""
    order = confidence.argsort(dim=-1, descending=True, stable=True)  # (B, T)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ranks < k[:, None]


def denoise_step(logits: torch.Tensor, allowed: torch.Tensor, k: torch.Tensor, cfg: SamplerConfig,
                 generator: torch.Generator | None, gumbel_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One low-confidence remasking step (SPEC §2) over a region of ``T`` positions.

    logits (B, T, V); ``allowed`` (B, T) the masked positions that may be committed now (in the
    current block); ``k`` (B,) how many to commit. Returns the candidates (B, T), drawn at every
    position, and the committed positions (B, T) bool: the ``k`` most confident allowed ones.
    """
    cand = gumbel_argmax(logits, cfg.temperature, generator, gumbel_dtype)  # (B, T)
    if cfg.remasking == "low_confidence":
        conf = logits.float().softmax(-1).gather(-1, cand[..., None]).squeeze(-1)  # (B, T)
    else:
        conf = torch.rand(allowed.shape, generator=generator, device=allowed.device)
    conf = conf.masked_fill(~allowed, float("-inf"))
    return cand, top_k_per_row(conf, k) & allowed


@torch.no_grad()
def generate(
    forward: Forward,
    prompt_ids: torch.Tensor,  # (B, P), left-padded
    prompt_mask: torch.Tensor | None,  # (B, P) 1 = real token, or None
    cfg: SamplerConfig,
    mask_id: int,
    generator: torch.Generator | None = None,
    recorder: StepRecorder | None = None,
) -> SampleOutput:
    """Run the remasking sampler; ``forward(ids, attention_mask) -> logits (B, T, V)``."""
    B, P = prompt_ids.shape
    device = prompt_ids.device
    L, bl = cfg.gen_length, cfg.block_length
    x = torch.cat([prompt_ids, torch.full((B, L), mask_id, dtype=prompt_ids.dtype, device=device)], 1)  # (B, T)
    attn = None
    if prompt_mask is not None and not bool(prompt_mask.all()):
        attn = torch.cat([prompt_mask.long(), torch.ones(B, L, dtype=torch.long, device=device)], 1)
    gdtype = torch.float64 if cfg.gumbel_dtype == "float64" else torch.float32
    positions = torch.arange(P + L, device=device)
    stats = CommitStats(B, device)
    step = 0
    for b in range(cfg.num_blocks):
        start, end = P + b * bl, P + (b + 1) * bl
        k_sched = num_transfer_tokens((x[:, start:end] == mask_id).sum(-1), cfg.steps_per_block)  # (B, n)
        in_block = (positions >= start) & (positions < end)  # (T,)
        for i in range(cfg.steps_per_block):
            logits = _guided_logits(forward, x, attn, cfg.cfg_scale, P, mask_id)  # (B, T, V)
            cand, commit = denoise_step(logits, (x == mask_id) & in_block, k_sched[:, i], cfg, generator, gdtype)
            stats.add(logits, commit)
            if recorder is not None:
                recorder.on_step(step, x.clone(), logits, cand, commit)
            x = torch.where(commit, cand, x)
            step += 1
    return stats.finish(x, x[:, P:])


def _guided_logits(forward: Forward, x: torch.Tensor, attn: torch.Tensor | None, scale: float,
                   prompt_len: int, mask_id: int) -> torch.Tensor:
    if scale <= 0:
        return forward(x, attn)
    un = x.clone()
    un[:, :prompt_len] = mask_id  # unconditional branch: the prompt is masked out
    both = forward(torch.cat([x, un]), None if attn is None else torch.cat([attn, attn]))
    cond, uncond = both.chunk(2)
    return uncond + (scale + 1) * (cond - uncond)


def completion_mask(completion: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for tokens up to and including the first EOS, 0 after it. (B, L) -> (B, L) float."""
    is_eos = completion == eos_id
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return (~after).float()
