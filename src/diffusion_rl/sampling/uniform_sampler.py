"""The sampler of a uniform-noise model: DiffusionGemma's EntropyBound sampler (transformers'
``DiffusionGemmaGenerationMixin.generate``), batched, with per-row random streams and a trajectory
recorder. The rules are ``entropy_bound.py``'s; this file runs them.

Canvas after canvas (``canvas_length`` tokens each, ``sampler.gen_length`` in all): the context (the
prompt, then each finished canvas) is encoded into the key/value cache once, and a canvas of uniform
random tokens is denoised for at most ``sampler.uniform.steps`` steps. Each step runs the decoder on
the canvas with the previous step's self-conditioning signal, draws a token at every position from
``softmax(logits / T_n)``, keeps the tokens the entropy bound accepts, re-noises the rest, and stops a
row once it is stable and confident (a stopped row is frozen; the loop ends when every row stopped).
The canvas written is the last argmax. A row whose canvas holds ``eos_id`` has ended: its later
canvases are still denoised with the batch (as transformers does) but written as EOS and recorded
nowhere; once every row has ended, no further canvas is run.

Random numbers, in transformers' order: the initial canvas, then per step the draws
(``torch.multinomial`` of the ``(C, V)`` probabilities) and the re-noising tokens (``torch.randint``).
With a :class:`~diffusion_rl.sampling.noise.RowNoise` each row draws from its own generator, only while
it has not stopped (a sample depends on its key and prompt alone); without one every draw is one call
over the batch from the global generator, exactly as ``generate`` draws. Either way, a row sampled
alone with its generator seeded ``s`` gives ``generate``'s tokens after ``torch.manual_seed(s)``
(tests/unit/sampling/test_uniform_sampler.py).

Pinned tokens (``canvas`` with the task's tokens, ``free_id`` elsewhere: Sudoku's givens) hold their
token in every canvas state and in the output; they count as accepted with entropy 0 (so the bound is
spent on the free positions), are never recorded as accepted, and the stopping rule's mean entropy runs
over the free positions. ``use_cache=False`` re-encodes the whole context at every step (the reference
the cache is checked against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sampling.entropy_bound import (
    StableAndConfident,
    accept_mask,
    step_temperature,
    token_entropy,
)
from diffusion_rl.sampling.noise import RowNoise
from diffusion_rl.sampling.sampler import SampleOutput, SamplerConfig
from diffusion_rl.sampling.uniform_trajectory import UniformTrajectory


def check_uniform_sampler(cfg: SamplerConfig, net: Any) -> None:
    """Fail in one line when the sampler cannot run the uniform-noise network ``net`` (its canvas)."""
    canvas_length = int(net.canvas_length)
    cfg.uniform.validate()
    if cfg.gen_length % canvas_length:
        raise ConfigError("sampler.gen_length", cfg.gen_length,
                          f"must be a multiple of the model's canvas_length={canvas_length} (it writes whole canvases)")
    masked_only = {"cfg_scale": 0.0, "kv_cache": "none", "decode": "fixed", "stop_after_eos": False,
                   "editing_threshold": None, "schedule": "even", "eos_gamma_min": 1.0, "eos_gamma_max": 1.0}
    for key, default in masked_only.items():
        if getattr(cfg, key) != default:
            raise ConfigError(f"sampler.{key}", getattr(cfg, key),
                              f"a masked-diffusion sampler option; a uniform-noise model runs the EntropyBound sampler "
                              f"(sampler.uniform.*): leave it at {default!r}")


@dataclass
class _Tally:
    """Per row: the entropy summed over the accepted tokens and their number; per call: forwards, query
    tokens and steps (what :class:`SampleOutput` reports)."""

    entropy_sum: torch.Tensor  # (B,) float64
    count: torch.Tensor  # (B,) long
    forwards: int = 0
    tokens: int = 0
    steps: int = 0


class _Draws:
    """The sampler's random tokens: per row from ``noise``, or one call over the batch (global generator)."""

    def __init__(self, noise: RowNoise | None, vocab: int, device: torch.device):
        self.gens = None if noise is None else noise.generators(device)
        self.vocab, self.device = vocab, device

    def random(self, B: int, C: int, rows: torch.Tensor) -> torch.Tensor:
        """(B, C) uniform tokens (rows ``rows`` (B,) bool draw; the others hold 0 with a RowNoise)."""
        if self.gens is None:
            return torch.randint(0, self.vocab, (B, C), device=self.device)
        out = torch.zeros(B, C, dtype=torch.long, device=self.device)
        for b in rows.nonzero()[:, 0].tolist():
            out[b] = torch.randint(0, self.vocab, (C,), generator=self.gens[b], device=self.device)
        return out

    def sample(self, probs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(B, C) one token per position from ``probs`` (B, C, V)."""
        B, C, V = probs.shape
        if self.gens is None:
            return torch.multinomial(probs.view(-1, V), num_samples=1).view(B, C)
        out = torch.zeros(B, C, dtype=torch.long, device=self.device)
        for b in rows.nonzero()[:, 0].tolist():
            out[b] = torch.multinomial(probs[b], num_samples=1, generator=self.gens[b])[:, 0]
        return out


@torch.no_grad()
def entropy_bound_generate(
    net: Any,  # a DiffusionGemmaLM, or a wrapper of one (peft, FSDP)
    prompt_ids: torch.Tensor,  # (B, P) left-padded
    prompt_mask: torch.Tensor | None,  # (B, P) 1 = real token, or None
    cfg: SamplerConfig,
    noise: RowNoise | None = None,
    recorder: UniformTrajectory | None = None,
    eos_id: int | None = None,
    canvas: torch.Tensor | None = None,  # (B, L) pinned tokens, free_id elsewhere
    free_id: int = -1,
    use_cache: bool = True,
) -> SampleOutput:
    """Sample ``sampler.gen_length`` tokens canvas by canvas (see the module docstring)."""
    C, V = int(net.canvas_length), int(net.vocab_size)
    check_uniform_sampler(cfg, net)
    B, L = prompt_ids.shape[0], cfg.gen_length
    device = prompt_ids.device
    mask = torch.ones_like(prompt_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask.bool()
    pinned = torch.zeros(B, L, dtype=torch.bool, device=device) if canvas is None else canvas != free_id
    given = torch.zeros(B, L, dtype=torch.long, device=device) if canvas is None else canvas.clamp_min(0).long()
    draws = _Draws(noise, V, device)
    completion = torch.zeros(B, L, dtype=prompt_ids.dtype, device=device)
    ended = torch.zeros(B, dtype=torch.bool, device=device)
    stats = _Tally(torch.zeros(B, dtype=torch.float64, device=device), torch.zeros(B, dtype=torch.long, device=device))
    context, cache = prompt_ids, (net.new_cache() if use_cache else None)
    done = 0
    for k in range(L // C):
        span = slice(k * C, (k + 1) * C)
        out, cache = _denoise_canvas(net, context, mask, cache, pinned[:, span], given[:, span], ended, draws, cfg,
                                     recorder, k, stats)
        out = torch.where(ended[:, None], torch.full_like(out, -1 if eos_id is None else eos_id), out)
        completion[:, span] = out.to(completion.dtype)
        done = k + 1
        if eos_id is not None:
            ended |= (out == eos_id).any(-1)
            if bool(ended.all()):
                break
        context = out.to(prompt_ids.dtype) if use_cache else torch.cat([context, out.to(prompt_ids.dtype)], 1)
        mask = torch.cat([mask, torch.ones(B, C, dtype=torch.bool, device=device)], 1)
    filled = 0.0
    if done * C < L:  # every row ended: the rest is EOS, never run
        completion[:, done * C:] = eos_id if eos_id is not None else 0
        filled = float(L - done * C)
    if recorder is not None:
        recorder.finish(completion)
    return SampleOutput(torch.cat([prompt_ids, completion], 1), completion, stats.entropy_sum, stats.count,
                        None, stats.forwards, stats.tokens, stats.steps, filled, 0.0)


def _denoise_canvas(net: Any, context: torch.Tensor, mask: torch.Tensor, cache: Any, pinned: torch.Tensor,
                    given: torch.Tensor, ended: torch.Tensor, draws: _Draws, cfg: SamplerConfig,
                    recorder: UniformTrajectory | None, k: int, stats: _Tally) -> tuple[torch.Tensor, Any]:
    """One canvas: its argmax tokens (B, C) and the cache (now holding ``context``)."""
    eb = cfg.uniform
    B, C = pinned.shape
    finished = torch.zeros(B, dtype=torch.bool, device=context.device)  # rows that stopped this canvas
    x = torch.where(pinned, given, draws.random(B, C, ~finished))  # (B, C)
    argmax, signal = x, None
    stop = StableAndConfident(eb)
    free = None if not bool(pinned.any()) else ~pinned
    first = True
    for remaining in range(eb.steps, 0, -1):
        T = step_temperature(eb, remaining).to(context.device)
        feed = context if (first or cache is None) else None
        out = net(input_ids=feed, attention_mask=mask, canvas=x, self_conditioning=signal,
                  cache=cache if cache is not None else None, soft_temperature=T)
        if cache is not None:
            cache = out.cache
        stats.forwards += 1 + (feed is not None)
        stats.tokens += C + (0 if feed is None else feed.shape[1])
        stats.steps += 1
        first = False
        processed = out.logits / T  # (B, C, V)
        drawn = draws.sample(torch.softmax(processed, dim=-1, dtype=torch.float32), ~finished)
        new_argmax = torch.where(pinned, given, processed.argmax(-1))
        entropy = token_entropy(processed)  # (B, C)
        accept = accept_mask(entropy.masked_fill(pinned, 0.0), eb.entropy_bound)
        kept = torch.where(accept, drawn, x)
        nxt = torch.where(pinned, given, torch.where(accept, kept, draws.random(B, C, ~finished)))
        live = ~finished & ~ended  # rows whose step is an action of the policy
        taken = accept & ~pinned & live[:, None]
        logp = processed.log_softmax(-1).gather(-1, drawn[..., None])[..., 0]  # (B, C) at T
        if recorder is not None:
            recorder.on_step(k, float(T), x, signal, taken, drawn, logp, entropy, new_argmax)
        stats.entropy_sum += (entropy.double() * taken).sum(-1)
        stats.count += taken.sum(-1)
        # a stopped row is frozen: its canvas, argmax and self-conditioning stay those of its last step
        new_argmax = torch.where(finished[:, None], argmax, new_argmax)
        x = torch.where(finished[:, None], x, nxt)
        signal = out.soft if signal is None else torch.where(finished[:, None, None], signal, out.soft)
        finished = finished | stop(new_argmax, entropy, free)
        argmax = new_argmax
        if bool(finished.all()):
            break
    return argmax, cache
