"""Block diffusion sampling (SDAR; docs/methods.md §2) with an exact key/value cache for finished
blocks.

The completion is cut into the *model's* blocks (``block_size`` tokens; ``sampler.block_length`` is
the masked-diffusion sampler's notion and is not used here) and filled left to right. Inside the
current block the low-confidence remasking rule of :mod:`diffusion_rl.sampling.sampler` runs
unchanged (its :func:`~diffusion_rl.sampling.sampler.denoise_step` and ``num_transfer_tokens``): ``steps / num_blocks``
steps per block, ``k`` tokens committed per step. A block model's attention is causal across blocks,
so finished blocks never see later ones: their keys and values are computed once (one extra forward
of the finished block, as SDAR's ``store_kv``) and cached, and each denoising step runs the model on
the current block only. That changes no output: at ``temperature = 0`` the tokens equal those of the
uncached sampler (``use_cache=False``, which reruns the whole prefix every step) and those of the
masked-diffusion sampler run with ``block_length = block_size`` on the same model (tests/unit/sampling/test_block.py).

Block alignment: blocks are counted from the first position of the input, as in SDAR and in the
block-causal mask of the embedded model, over a prompt left-padded to whole blocks (done here if the
caller has not: :func:`~diffusion_rl.models.policy.encode_prompts` with ``pad_to_multiple_of``), so
the completion starts on a block boundary and every block is either all prompt or all completion.

Token editing (``sampler.editing_threshold``, LLaDA2.1's released sampler): at every step a decoded
token of the current block is replaced by the step's candidate where they differ and the candidate's
probability is above the threshold; once the block is full, up to ``sampler.max_post_steps`` more passes
revise it while they change a token. The released 2.1 sampler does the same over a block-causal
mask; its confidences are those of the temperature-scaled softmax where ours are the temperature-1
ones of the remasking rule (equal at temperature 0). An edited token's recorded log-probability is
the editing step's (``rollout/mismatch_log_ratio`` shows what editing moves away from the policy the
loss scores); ``rollout/edited_per_sample`` counts the replacements.

Run ``python benchmarks/block.py`` for the speed of the cache against recomputing the prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import torch
from torch import nn

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.sampling.noise import RowNoise
from diffusion_rl.sampling.sampler import (
    CommitStats,
    SampleOutput,
    SamplerConfig,
    StepRecorder,
    block_schedule,
    denoise_step,
    eos_scale_at,
    fill_after,
    gumbel_argmax,
    gumbel_dtype,
    mark_ended,
    start_canvas,
)


def check_block_sampler(cfg: SamplerConfig, block_size: int) -> None:
    """Fail in one line when the sampler cannot run a model with blocks of ``block_size``."""
    if block_size < 1:
        raise ConfigError("model.block_size", block_size, "must be >= 1 for block diffusion sampling")
    if cfg.gen_length % block_size:
        raise ConfigError("sampler.gen_length", cfg.gen_length,
                          f"must be a multiple of model.block_size={block_size} (a block model fills whole blocks)")
    num_blocks = cfg.gen_length // block_size
    if cfg.steps % num_blocks:
        raise ConfigError("sampler.steps", cfg.steps,
                          f"must be divisible by the number of model blocks gen_length/block_size={num_blocks}")
    if cfg.cfg_scale > 0:
        raise ConfigError("sampler.cfg_scale", cfg.cfg_scale, "must be 0 with a block model (no guidance in the block sampler)")
    if cfg.kv_cache != "none":
        raise ConfigError("sampler.kv_cache", cfg.kv_cache,
                          "must be none with a block model (its sampler already caches finished blocks, exactly)")
    if cfg.schedule == "ass" and num_blocks != 1:
        raise ConfigError("sampler.schedule", cfg.schedule,
                          f"needs one model block (model.block_size={block_size} < sampler.gen_length={cfg.gen_length})")


def align_prompt(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None, block_size: int,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-pad a prompt to whole blocks. -> ids (B, P'), mask (B, P'), number of columns added."""
    B, P = prompt_ids.shape
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids)
    pad = -P % block_size
    if pad:
        prompt_ids = torch.cat([torch.full((B, pad), pad_id, dtype=prompt_ids.dtype, device=prompt_ids.device), prompt_ids], 1)
        prompt_mask = torch.cat([torch.zeros((B, pad), dtype=prompt_mask.dtype, device=prompt_mask.device), prompt_mask], 1)
    return prompt_ids, prompt_mask, pad


@torch.no_grad()
def block_generate(
    net: nn.Module,
    prompt_ids: torch.Tensor,  # (B, P), left-padded
    prompt_mask: torch.Tensor | None,  # (B, P) 1 = real token, or None
    cfg: SamplerConfig,
    block_size: int,
    mask_id: int,
    noise: RowNoise | None = None,
    recorder: StepRecorder | None = None,
    use_cache: bool = True,
    eos_id: int | None = None,
    canvas: torch.Tensor | None = None,
) -> SampleOutput:
    """Sample block by block; ``net(input_ids=, attention_mask=, past_key_values=, use_cache=)``.

    With ``use_cache=False`` every step runs the model on ``[prompt, finished blocks, current block]``
    (the reference the cache is checked against). A ``recorder`` sees full-width ``(B, P + L)``
    tensors; the logits outside the current block are zeros (a block model has not computed them:
    EGSPO-SA's greedy completions of later blocks are therefore not meaningful here).
    ``sampler.decode``, ``sampler.schedule`` (``ass``: one model block), EOSER and
    ``sampler.stop_after_eos`` (both need ``eos_id``; SDAR's sampler stops after a block that holds
    EOS too), ``canvas`` (pinned tokens) and ``noise`` (per-row random
    numbers) work as in the masked-diffusion sampler.
    """
    _check_call(cfg, block_size, recorder, eos_id)
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    prompt_ids, keep_prompt, pad = align_prompt(prompt_ids, prompt_mask, block_size, mask_id)  # pads: never attended
    P, L, bs = prompt_ids.shape[1], cfg.gen_length, block_size
    n_steps = cfg.steps // (L // bs)
    x = torch.cat([prompt_ids, start_canvas(canvas, B, L, mask_id, prompt_ids)], 1)  # (B, T)
    keep = torch.cat([keep_prompt.long(), torch.ones(B, L, dtype=torch.long, device=device)], 1)  # (B, T)
    stats = CommitStats(B, P + L, device)
    cache = None
    if use_cache and P > 0:  # prefill: the prompt's blocks
        cache = net(input_ids=x[:, :P], attention_mask=keep[:, :P], use_cache=True).past_key_values
        stats.forward(P)
    ended_at = torch.full((B,), P + L, dtype=torch.long, device=device)  # stop_after_eos: where a row ended
    step = 0
    for start in range(P, P + L, bs):
        end = start + bs
        live = ended_at > start  # (B,) the rows still decoding
        logits_of = partial(_block_logits, net, x, keep, cache, start, end, use_cache, stats)  # (B, bs, V)
        counts = block_schedule(cfg, x[:, start:end], mask_id, n_steps, live)  # a view: sees the commits
        step = _fill_block(x, logits_of, counts, start, end, step, live, cfg, mask_id, noise, eos_id, stats, recorder)
        _revise_block(x, logits_of, start, end, live, cfg, mask_id, noise, stats)
        if cfg.stop_after_eos and end < P + L and mark_ended(x, P, end, eos_id, mask_id, ended_at):  # type: ignore[arg-type]
            break
        if use_cache and end < P + L:  # the finished block is clean context from now on
            cache = net(input_ids=x[:, start:end], attention_mask=keep[:, :end], past_key_values=cache,
                        use_cache=True).past_key_values
            stats.forward(bs)
    if cfg.stop_after_eos:
        x = fill_after(x, ended_at, eos_id, mask_id, stats, recorder)  # type: ignore[arg-type]
    return stats.finish(x[:, pad:], x[:, P:])


def _check_call(cfg: SamplerConfig, block_size: int, recorder: StepRecorder | None, eos_id: int | None) -> None:
    """Fail in one line when :func:`block_generate` cannot run this sampler, recorder and EOS id."""
    check_block_sampler(cfg, block_size)
    if cfg.editing_threshold is not None and recorder is not None:
        raise ConfigError("sampler.editing_threshold", cfg.editing_threshold,
                          "must be null for an objective that trains on the recorded trajectory (an edited token has "
                          "no single unmasking step)")
    if (cfg.stop_after_eos or cfg.eoser) and eos_id is None:
        raise ValueError("sampler.stop_after_eos and EOSER need the EOS id")


def _fill_block(x: torch.Tensor, logits_of: Callable[[], torch.Tensor], counts: Iterator[torch.Tensor | None],
                start: int, end: int, step: int, live: torch.Tensor, cfg: SamplerConfig, mask_id: int,
                noise: RowNoise | None, eos_id: int | None, stats: CommitStats, recorder: StepRecorder | None) -> int:
    """The denoising steps of the current block ``x[:, start:end]`` (``counts``: each step's commit
    counts), committed (and, with editing on, edited) in place in ``x`` (B, T). -> the next global step"""
    gdtype = gumbel_dtype(cfg)
    for k in counts:
        blk = x[:, start:end]  # (B, bs)
        logits = logits_of()  # (B, bs, V)
        cand, commit = denoise_step(logits, (blk == mask_id) & live[:, None], k, cfg, noise, gdtype,
                                    eos_scale_at(cfg, eos_id, step))  # (B, bs)
        stats.add(logits, commit, cand, start)
        if recorder is not None:
            _record(recorder, step, x, logits, cand, commit, start)
        edit = edits(logits, cand, blk, live, mask_id, cfg)  # (B, bs) decoded tokens replaced (editing on)
        stats.edit(logits, edit, cand, start)
        x[:, start:end] = torch.where(commit | edit, cand, blk)
        step += 1
    return step


def _revise_block(x: torch.Tensor, logits_of: Callable[[], torch.Tensor], start: int, end: int, live: torch.Tensor,
                  cfg: SamplerConfig, mask_id: int, noise: RowNoise | None, stats: CommitStats) -> None:
    """Token editing's passes over the full block (``sampler.max_post_steps``, while they change a
    token), in place in ``x``; none with editing off."""
    for _ in range(cfg.max_post_steps if cfg.editing_threshold is not None else 0):
        blk = x[:, start:end]
        logits = logits_of()
        cand = gumbel_argmax(logits, cfg.temperature, noise, gumbel_dtype(cfg), live)
        edit = edits(logits, cand, blk, live, mask_id, cfg)
        if not bool(edit.any()):
            break
        stats.edit(logits, edit, cand, start)
        x[:, start:end] = torch.where(edit, cand, blk)


def _block_logits(net: nn.Module, x: torch.Tensor, keep: torch.Tensor, cache, start: int, end: int,
                  use_cache: bool, stats: CommitStats) -> torch.Tensor:
    """fp32 logits (B, bs, V) of the current block ``x[:, start:end]``: over the cache of the finished
    blocks, or by rerunning everything before it."""
    if use_cache:
        stats.forward(end - start)
        return net(input_ids=x[:, start:end], attention_mask=keep[:, :end], past_key_values=cache).logits.float()
    stats.forward(end)
    return net(input_ids=x[:, :end], attention_mask=keep[:, :end], keep=slice(start, end)).logits.float()


def edits(logits: torch.Tensor, cand: torch.Tensor, block: torch.Tensor, live: torch.Tensor, mask_id: int,
          cfg: SamplerConfig) -> torch.Tensor:
    """LLaDA2.1's token editing: (B, bs) bool, the decoded (not masked) positions of live rows whose
    candidate differs from the token there with probability above ``sampler.editing_threshold``
    (all False when editing is off)."""
    if cfg.editing_threshold is None:
        return torch.zeros_like(block, dtype=torch.bool)
    conf = logits.softmax(-1).gather(-1, cand[..., None]).squeeze(-1)  # (B, bs)
    return (block != mask_id) & (cand != block) & live[:, None] & (conf > cfg.editing_threshold)


def _record(recorder: StepRecorder, step: int, x: torch.Tensor, logits: torch.Tensor, cand: torch.Tensor,
            commit: torch.Tensor, start: int) -> None:
    """Hand the recorder full-width tensors, as the masked-diffusion sampler does."""
    B, T = x.shape
    end = start + logits.shape[1]
    full_logits = logits.new_zeros(B, T, logits.shape[-1])  # (B, T, V)
    full_logits[:, start:end] = logits
    full_cand = x.clone()
    full_cand[:, start:end] = cand
    full_commit = torch.zeros_like(x, dtype=torch.bool)
    full_commit[:, start:end] = commit
    recorder.on_step(step, x.clone(), full_logits, full_cand, full_commit)
