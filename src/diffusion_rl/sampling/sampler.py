"""The low-confidence remasking sampler of LLaDA (docs/methods.md §2), batched over prompts x group
size, and the fewer-forward options of Fast-dLLM beside it (docs/methods.md §10).

Start from ``[prompt, MASK * gen_length]``; the completion is cut into blocks of ``block_length``
filled left to right, each with ``steps / num_blocks`` denoising steps. At each step one forward pass
gives logits; a candidate token is drawn at every masked position (Gumbel-max at temperature ``tau``,
plain argmax at ``tau = 0``); the ``k`` most confident candidates inside the current block are
committed. ``k`` follows :func:`num_transfer_tokens`.

One step (candidates, confidence, the committed set) is :func:`denoise_step`, shared with the block
sampler (``block.py``). A :class:`StepRecorder` passed to :func:`generate` sees every step's state,
logits and committed positions, so per-step trajectories (EGSPO) are recorded from the forward pass
the sampler already makes. :class:`CommitStats` accumulates, per sample, what the rollout reports:
the entropy of the distributions the committed tokens were drawn from (``train/entropy``), the
sampler's own temperature-1 log-probability of each committed token (``rollout/mismatch_log_ratio``,
behaviour correction) and the forward passes spent (``rollout/forwards_per_sample``).

Every random number (Gumbel noise, random-remasking confidences) is drawn per row from a
:class:`~diffusion_rl.sampling.noise.RowNoise` keyed by the row's ids, and a row draws only while it
has a position to commit: a sample depends on its key and its prompt, not on the rows that share
its call (``sampler.rollout_batch_size``, the number of processes, the evaluation batch size).

The exact sampler is ``decode=fixed kv_cache=none stop_after_eos=false`` (the defaults). The options:

- ``decode=threshold``: every masked candidate of the current block whose probability is *above*
  ``threshold`` is committed, and always the most confident one; ``decode=factor``: with the block's
  confidences sorted ``c1 >= c2 >= ...``, the first ``n`` while ``c_n >= 1 - factor / (n + 1)``. A
  block then takes as many steps as it needs (at most ``block_length``: each step commits at least
  one token per unfinished row); ``steps`` is not used. With ``threshold = 1.0`` and a schedule of
  one token per step (``steps = gen_length``) this is the exact sampler, token for token.
- ``kv_cache=prefix|dual`` (``cache.py``): keys and values of the finished part (and, for ``dual``, of
  the masked suffix) are reused within a block instead of being recomputed; approximations for a
  bidirectional model, refreshed by a full forward at each block start (and every ``kv_cache_refresh``
  steps when set: ``kv_cache_refresh=1`` is the exact sampler again).
- ``stop_after_eos``: a row that holds an EOS with nothing masked after it at the end of a block
  decodes no further, and its remaining positions are set to EOS; once every row has ended, the
  remaining blocks take no forward pass (the completion mask ignores tokens after the first EOS; the
  likelihood estimators still see them as context).

Two decoders of CJ-GRPO (yjyddq/EOSER-ASS-RL @ 5affb4e, ``cj-grpo/cj_grpo_trainer_{eoser,ass,eoser_ass}.py``),
options of ``decode=fixed`` that any objective may use:

- ``schedule=ass`` (ascending step size, :func:`ass_transfer_tokens`): ``steps = floor(log2 L)``, step
  ``i`` commits ``2^i`` tokens and the last step every position left (``get_num_transfer_tokens_ass``
  with one block: 1, 2, 4, ..., 64, 129 for ``L = 256``), so the completion takes ``log2 L`` forwards.
  One block only (the public ``block_num=1``; its ``block_num > 1`` layout of unequal blocks is not
  implemented). With pinned tokens a row commits ``min(2^i, left)`` and the last step the rest.
- ``eos_gamma_min`` / ``eos_gamma_max`` (EOSER, :func:`eos_factor`): before the top-k, an EOS
  candidate's confidence is multiplied by ``gamma_min + (gamma_max - gamma_min) t``, ``t`` the
  step's progress: ``s / (steps - 1)`` over the sampler's global step ``s`` (the public ``sampling``;
  it runs one block, here the factor rises over the whole decoding whatever the blocks), or with
  ``schedule=ass`` the share ``(2^(s+1) - 1) / 2^steps`` of tokens decoded by the end of the step
  (the public ``ass_sampling``). Early EOS candidates lose the top-k to content tokens, so the model
  does not end the answer before writing it; the drawn tokens and their probabilities are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

import torch
from torch import nn

from diffusion_rl.core.config import renamed
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.policy import Forward, PolicyForward
from diffusion_rl.sampling.cache import StepLogits, step_logits
from diffusion_rl.sampling.entropy_bound import EntropyBoundConfig
from diffusion_rl.sampling.noise import RowNoise, uniform

DECODES = ("fixed", "threshold", "factor")
CACHES = ("none", "prefix", "dual")
SCHEDULES = ("even", "ass", "maskgit")


@dataclass
class SamplerConfig:
    gen_length: int = 256
    block_length: int = 32
    steps: int = 128  # decode=fixed only
    temperature: float = 0.9  # tau; 0 = greedy
    remasking: str = "low_confidence"  # or "random"
    cfg_scale: float = 0.0  # classifier-free guidance (LLaDA); 0 = off
    gumbel_dtype: str = "float64"  # float64 as LLaDA; float32 is faster and nearly the same
    # rows per sampler call in training rollouts (0 = a process's whole share): bounds memory on big
    # models; changes no sample (each row's noise is keyed by its own global row: sampling/noise.py)
    rollout_batch_size: int = 0
    # Fewer forward passes (docs/methods.md §10, Fast-dLLM); the defaults are the exact sampler of
    # docs/methods.md §2.
    decode: str = "fixed"  # fixed (steps / num_blocks per block) | threshold | factor
    threshold: float = 0.9  # decode=threshold: the paper's evaluation value
    factor: float = 1.0  # decode=factor: commit the n most confident while c_n >= 1 - factor / (n + 1)
    kv_cache: str = "none"  # none | prefix | dual: key/value caches of a full-attention model
    kv_cache_refresh: int = 0  # also recompute everything every this many steps inside a block (0: at block starts only)
    stop_after_eos: bool = False  # a row that has ended at a block end takes EOS for the rest; stop once all have
    # LLaDA2.1's token editing (block models; sampling/block.py): a decoded token of the current block is
    # replaced where the model now prefers another with probability above this; None = no editing
    editing_threshold: float | None = None
    max_post_steps: int = 16  # editing: passes over a full block while they still change a token
    # decode=fixed's commit counts: even (num_transfer_tokens) | ass (CJ-GRPO's ascending step size:
    # step i commits 2^i tokens, the last the rest; one block, steps = floor(log2 gen_length)) | maskgit
    # (MaskGIT's linear schedule, MDPO's public rollouts: maskgit_transfer_tokens)
    schedule: str = "even"
    # EOSER (CJ-GRPO): an EOS candidate's confidence times a factor rising linearly from eos_gamma_min
    # at the first step to eos_gamma_max at the last (the public run: 0.01 -> 1.0); 1.0 / 1.0 = off
    eos_gamma_min: float = 1.0
    eos_gamma_max: float = 1.0
    # a uniform-noise model (DiffusionGemma) runs its own sampler, EntropyBound, whose settings these are
    # (the released generation_config.json's); the options above are the masked-diffusion samplers'
    uniform: EntropyBoundConfig = field(default_factory=EntropyBoundConfig)

    # deprecated names of kv_cache / kv_cache_refresh, taken for one release with a warning
    cache: str | None = None
    cache_refresh: int | None = None

    def __post_init__(self) -> None:
        if self.cache is not None:
            self.kv_cache, self.cache = renamed("sampler.cache", "sampler.kv_cache", self.cache), None
        if self.cache_refresh is not None:
            self.kv_cache_refresh = renamed("sampler.cache_refresh", "sampler.kv_cache_refresh", self.cache_refresh)
            self.cache_refresh = None

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
        if self.decode not in DECODES:
            raise ConfigError(f"{prefix}.decode", self.decode, f"allowed: {', '.join(DECODES)}")
        if self.decode != "fixed" and self.remasking != "low_confidence":
            raise ConfigError(f"{prefix}.remasking", self.remasking,
                              f"must be low_confidence with {prefix}.decode={self.decode} (it thresholds probabilities)")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"{prefix}.threshold", self.threshold, "must be in [0, 1]")
        if not self.factor > 0:
            raise ConfigError(f"{prefix}.factor", self.factor, "must be > 0")
        if self.kv_cache not in CACHES:
            raise ConfigError(f"{prefix}.kv_cache", self.kv_cache, f"allowed: {', '.join(CACHES)}")
        if self.kv_cache != "none" and self.cfg_scale > 0:
            raise ConfigError(f"{prefix}.cfg_scale", self.cfg_scale, f"must be 0 with {prefix}.kv_cache={self.kv_cache}")
        if self.kv_cache_refresh < 0:
            raise ConfigError(f"{prefix}.kv_cache_refresh", self.kv_cache_refresh, "must be >= 0 (0 = at block starts only)")
        if self.editing_threshold is not None and not 0.0 <= self.editing_threshold <= 1.0:
            raise ConfigError(f"{prefix}.editing_threshold", self.editing_threshold, "must be in [0, 1] or null (no editing)")
        if self.max_post_steps < 0:
            raise ConfigError(f"{prefix}.max_post_steps", self.max_post_steps, "must be >= 0")
        self._validate_cj_decoders(prefix)
        self.uniform.validate(f"{prefix}.uniform")

    def _validate_cj_decoders(self, prefix: str) -> None:
        """ASS and EOSER (CJ-GRPO's decoders) on top of the checks above."""
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"{prefix}.schedule", self.schedule, f"allowed: {', '.join(SCHEDULES)}")
        if self.schedule != "even" and self.decode != "fixed":
            raise ConfigError(f"{prefix}.schedule", self.schedule, f"needs {prefix}.decode=fixed (it sets the commit counts)")
        if self.schedule == "ass":
            if self.block_length != self.gen_length:
                raise ConfigError(f"{prefix}.block_length", self.block_length,
                                  f"must equal {prefix}.gen_length={self.gen_length} with {prefix}.schedule=ass (one block)")
            if self.gen_length < 2 or self.steps != ass_steps(self.gen_length):
                raise ConfigError(f"{prefix}.steps", self.steps, f"must be floor(log2 gen_length)={ass_steps(self.gen_length)} "
                                  f"with {prefix}.schedule=ass (step i commits 2^i tokens); gen_length must be >= 2")
        for key in ("eos_gamma_min", "eos_gamma_max"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"{prefix}.{key}", getattr(self, key), "must be >= 0 (1.0 and 1.0: EOSER off)")
        if self.eoser and self.decode != "fixed":
            raise ConfigError(f"{prefix}.decode", self.decode,
                              "must be fixed with EOSER (eos_gamma_min/max != 1: its factor rises over a known number of steps)")
        if self.eoser and self.remasking != "low_confidence":
            raise ConfigError(f"{prefix}.remasking", self.remasking, "must be low_confidence with EOSER (it scales confidences)")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    @property
    def eoser(self) -> bool:
        """Whether EOSER scales EOS confidences (a factor other than 1 at some step)."""
        return self.eos_gamma_min != 1.0 or self.eos_gamma_max != 1.0

    @property
    def exact(self) -> bool:
        """Whether this is the exact sampler of docs/methods.md §2 (no fewer-forward option on, the even
        schedule, no EOS scaling)."""
        return (self.decode == "fixed" and self.kv_cache == "none" and not self.stop_after_eos
                and self.editing_threshold is None and self.schedule == "even" and not self.eoser)

    def as_exact(self) -> SamplerConfig:
        """The exact sampler of docs/methods.md §2: low-confidence remasking with every fewer-forward
        option off, the even schedule and no EOS scaling (a rollout sampler may unmask in random order or
        with CJ-GRPO's decoders; the papers evaluate this way)."""
        return replace(self, decode="fixed", kv_cache="none", stop_after_eos=False, remasking="low_confidence",
                       schedule="even", eos_gamma_min=1.0, eos_gamma_max=1.0)


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

    def on_fill(self, filled: torch.Tensor, token: int) -> None:
        """``filled`` (B, T) bool positions set to ``token`` without a step (``stop_after_eos``)."""


@dataclass
class SampleOutput:
    sequences: torch.Tensor  # (B, P + L) prompt and completion
    completion: torch.Tensor  # (B, L)
    # sum over the committed tokens of a row of the entropy of softmax(logits) at their position, and
    # their number: (B,) each; train/entropy is sum / count over the batch
    entropy_sum: torch.Tensor | None = None
    num_committed: torch.Tensor | None = None
    # (B, L) float32: the sampler's temperature-1 log-probability of the token at each completion
    # position, from the logits it committed the token with (0 where filled without a forward)
    token_logp: torch.Tensor | None = None
    forwards: int = 0  # forward passes each row went through (classifier-free guidance counts 2)
    forward_tokens: int = 0  # query positions each row sent through the model (the FLOP measure)
    steps: int = 0  # denoising steps taken
    filled: float = 0.0  # completion tokens set to EOS without a forward (stop_after_eos), mean per row
    edited: float = 0.0  # token replacements by editing (sampler.editing_threshold), mean per row


class CommitStats:
    """Per-row sums over committed tokens and the forward passes spent, accumulated step by step
    (what :class:`SampleOutput` reports)."""

    def __init__(self, batch: int, width: int, device: torch.device):
        self.entropy_sum = torch.zeros(batch, dtype=torch.float64, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)
        self.token_logp = torch.zeros(batch, width, dtype=torch.float32, device=device)  # (B, T)
        self.forwards = self.forward_tokens = self.steps = 0
        self.filled = self.edited = 0.0

    def forward(self, width: int, passes: int = 1) -> None:
        """Count one model call over ``width`` query positions per row (``passes`` rows per sample)."""
        self.forwards += passes
        self.forward_tokens += passes * width

    def add(self, logits: torch.Tensor, commit: torch.Tensor, cand: torch.Tensor, offset: int = 0) -> None:
        """logits (B, R, V), commit (B, R) bool and candidates (B, R) of one step over the positions
        ``offset .. offset + R`` of the sequence."""
        rows = commit.nonzero()[:, 0]  # (n,)
        logp = logits[commit].float().log_softmax(-1)  # (n, V)
        ent = -(logp.exp() * logp).sum(-1)  # (n,)
        self.entropy_sum.index_add_(0, rows, ent.double())
        self.count += commit.sum(-1)
        view = self.token_logp[:, offset:offset + commit.shape[1]]  # (B, R) writes through
        view[commit] = logp.gather(-1, cand[commit][:, None]).squeeze(-1)
        self.steps += 1

    def finish(self, sequences: torch.Tensor, completion: torch.Tensor) -> SampleOutput:
        L = completion.shape[1]
        return SampleOutput(sequences, completion, self.entropy_sum, self.count, self.token_logp[:, -L:],
                            self.forwards, self.forward_tokens, self.steps, self.filled, self.edited)

    def edit(self, logits: torch.Tensor, edit: torch.Tensor, cand: torch.Tensor, offset: int) -> None:
        """An edited token's log-probability replaces the one it was committed with (its own logits
        and the new token); logits (B, R, V), edit and cand (B, R) at ``offset``."""
        view = self.token_logp[:, offset:offset + edit.shape[1]]
        view[edit] = logits[edit].float().log_softmax(-1).gather(-1, cand[edit][:, None]).squeeze(-1)
        self.edited += float(edit.sum()) / max(edit.shape[0], 1)


def num_transfer_tokens(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit per step: ``m // n`` each, the remainder one each over the first steps.

    masked: (B,) masked-token counts of the block -> (B, steps) int64
    """
    base = (masked // steps)[:, None]  # (B, 1)
    rem = (masked % steps)[:, None]  # (B, 1)
    idx = torch.arange(steps, device=masked.device)[None, :]  # (1, steps)
    return (base + (idx < rem).long()).long()


def ass_steps(gen_length: int) -> int:
    """ASS's number of steps, ``floor(log2 L)`` (``int(log2(gen_length))`` in the public code)."""
    return max(gen_length, 1).bit_length() - 1


def ass_transfer_tokens(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """ASS's commit counts: step ``i`` commits ``2^i`` tokens, the last step every one left.

    masked: (B,) masked-token counts -> (B, steps) int64. With ``masked = L`` and ``steps = floor(log2
    L)`` these are the public ``get_num_transfer_tokens_ass`` counts (one block); fewer masked
    positions (pinned tokens) run out early: ``min(2^i, left)``, then 0.
    """
    want = 2 ** torch.arange(steps, device=masked.device)  # (steps,) 1, 2, 4, ...
    before = want.cumsum(0) - want  # (steps,) committed before step i, had every step its 2^i
    k = (masked[:, None] - before[None, :]).clamp_min(0).minimum(want[None, :])  # (B, steps)
    k[:, -1] = masked - k[:, :-1].sum(-1)  # the last step: everything left
    return k.long()


def eos_factor(cfg: SamplerConfig, step: int) -> float:
    """EOSER's factor on an EOS candidate's confidence at the sampler's global step ``step``: linear
    in ``step / (steps - 1)``, or with ``schedule=ass`` in the share of tokens decoded by the end of the
    step, ``(2^(step+1) - 1) / 2^steps``; ``gamma_max`` with one step under either (the public
    ``sampling`` / ``ass_sampling`` guard ``total_steps > 1``)."""
    if cfg.steps <= 1:
        return cfg.eos_gamma_max
    if cfg.schedule == "ass":
        t = (2 ** (step + 1) - 1) / 2 ** cfg.steps
    else:
        t = min(max(step, 0), cfg.steps - 1) / (cfg.steps - 1)
    return cfg.eos_gamma_min + (cfg.eos_gamma_max - cfg.eos_gamma_min) * t


def maskgit_transfer_tokens(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """MaskGIT's linear schedule (MDPO's public rollouts, ``get_num_transfer_tokens_maskgit``): after step
    ``t`` the masked share is ``max(1 - (t + 1) / steps, 1e-6)``, so ``m - floor(m * ratio)`` tokens are
    committed by then (float64, as there). Equal to :func:`num_transfer_tokens` when ``steps`` divides ``m``;
    otherwise the remainder spreads over the steps instead of going to the first ones.

    masked: (B,) masked-token counts -> (B, steps) int64
    """
    ratio = torch.tensor([max(1 - (t + 1) / steps, 1e-6) for t in range(steps)], dtype=torch.float64,
                         device=masked.device)  # (steps,)
    done = masked[:, None] - torch.floor(masked[:, None].double() * ratio[None, :]).long()  # (B, steps) cumulative
    return torch.cat([done[:, :1], done[:, 1:] - done[:, :-1]], 1).long()


TRANSFER_COUNTS = {"even": num_transfer_tokens, "ass": ass_transfer_tokens, "maskgit": maskgit_transfer_tokens}


def block_schedule(cfg: SamplerConfig, block: torch.Tensor, mask_id: int,
                   fixed_steps: int, live: torch.Tensor | None = None) -> Iterator[torch.Tensor | None]:
    """The commit counts of one block's steps. ``block`` (B, n) is a *view* of the block in the state
    the sampler updates in place; ``live`` (B,) bool the rows still decoding (None: all).
    ``decode=fixed`` gives ``fixed_steps`` counts (B,) of :func:`num_transfer_tokens` (of
    :func:`ass_transfer_tokens` / :func:`maskgit_transfer_tokens` with ``schedule=ass`` / ``maskgit``); ``threshold`` /
    ``factor`` give ``None`` (the count is read from the confidences) while a live row has a masked
    position left, at most as many times as there were at the start."""
    def open_() -> torch.Tensor:  # (B, n) the positions left to decode
        return block == mask_id if live is None else (block == mask_id) & live[:, None]

    masked = open_().sum(-1)  # (B,)
    if cfg.decode == "fixed":
        yield from TRANSFER_COUNTS[cfg.schedule](masked, fixed_steps).unbind(1)
        return
    for _ in range(int(masked.max()) if masked.numel() else 0):
        if not bool(open_().any()):
            return
        yield None


def gumbel_argmax(logits: torch.Tensor, temperature: float, noise: RowNoise | None,
                  dtype: torch.dtype = torch.float64, active: torch.Tensor | None = None) -> torch.Tensor:
    """``argmax(logits / tau + Gumbel)``; plain argmax at ``tau = 0``. logits (B, T, V) -> (B, T).

    ``noise`` keys each row's draw (None: the global generator); ``active`` (B,) bool the rows that
    draw (None: all), the others get no noise."""
    if temperature == 0:
        return logits.argmax(-1)
    if active is None:
        active = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
    g = uniform(noise, tuple(logits.shape[1:]), active, dtype, logits.device)  # (B, T, V)
    g.clamp_(min=torch.finfo(dtype).tiny).log_().neg_().log_().neg_()  # Gumbel noise, in place: one buffer
    return g.add_(logits.to(dtype) / temperature).argmax(-1)  # logits / tau + noise, as the reference computes it


def top_k_per_row(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean (B, T) selecting the ``k[b]`` largest entries of each row of ``confidence``."""
    order = confidence.argsort(dim=-1, descending=True, stable=True)  # (B, T)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ranks < k[:, None]


def parallel_count(conf: torch.Tensor, allowed: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """How many candidates ``decode=threshold|factor`` commits (docs/methods.md §10): (B, T) -> (B,)
    long.

    threshold: those with probability above ``cfg.threshold``; factor: the first ``n`` of the sorted
    confidences while ``c_n >= 1 - factor / (n + 1)``. Always at least one where any is allowed.
    """
    if cfg.decode == "threshold":
        n = ((conf > cfg.threshold) & allowed).sum(-1)
    else:
        c = conf.masked_fill(~allowed, float("-inf")).sort(-1, descending=True).values  # (B, T)
        rank = torch.arange(1, c.shape[-1] + 1, device=c.device, dtype=c.dtype)  # (T,) n = 1, 2, ...
        n = (c >= 1 - cfg.factor / (rank + 1)).long().cumprod(-1).sum(-1)
    return torch.where(allowed.any(-1), n.clamp_min(1), torch.zeros_like(n))


def denoise_step(logits: torch.Tensor, allowed: torch.Tensor, k: torch.Tensor | None, cfg: SamplerConfig,
                 noise: RowNoise | None, gumbel_dtype: torch.dtype,
                 eos_scale: tuple[int, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One low-confidence remasking step (docs/methods.md §2) over a region of ``T`` positions.

    logits (B, T, V); ``allowed`` (B, T) the masked positions that may be committed now (in the
    current block); ``k`` (B,) how many to commit, or None to let ``cfg.decode`` (threshold, factor)
    choose from the confidences. ``eos_scale`` ``(eos_id, factor)``: EOSER, an EOS candidate's
    confidence times ``factor`` (None: unscaled). Returns the candidates (B, T), drawn at every position, and the
    committed positions (B, T) bool: the ``k`` most confident allowed ones. Only the rows with an
    allowed position draw from ``noise`` (``sampling/noise.py``): a row's numbers depend on its own
    progress alone, not on the rows beside it.
    """
    active = allowed.any(-1)  # (B,)
    cand = gumbel_argmax(logits, cfg.temperature, noise, gumbel_dtype, active)  # (B, T)
    if cfg.remasking == "low_confidence":
        conf = logits.float().softmax(-1).gather(-1, cand[..., None]).squeeze(-1)  # (B, T)
        if eos_scale is not None:
            conf = torch.where(cand == eos_scale[0], conf * eos_scale[1], conf)
    else:
        conf = uniform(noise, tuple(allowed.shape[1:]), active, torch.float32, allowed.device)  # (B, T)
    if k is None:
        k = parallel_count(conf, allowed, cfg)
    conf = conf.masked_fill(~allowed, float("-inf"))
    return cand, top_k_per_row(conf, k) & allowed


def eos_scale_at(cfg: SamplerConfig, eos_id: int | None, step: int) -> tuple[int, float] | None:
    """:func:`denoise_step`'s ``eos_scale`` at global step ``step``: None unless EOSER is on."""
    if not cfg.eoser:
        return None
    assert eos_id is not None, "EOSER needs the EOS id"
    return eos_id, eos_factor(cfg, step)


def rows_ended(x: torch.Tensor, start: int, end: int, eos_id: int, mask_id: int) -> torch.Tensor:
    """(B,) bool: the rows of ``x[:, start:end]`` holding an EOS with no masked position after their first one."""
    part = x[:, start:end]  # (B, n)
    eos = (part == eos_id).long().cumsum(-1) > 0  # (B, n) at or after the first EOS
    return eos[:, -1] & ~(eos & (part == mask_id)).any(-1)


def mark_ended(x: torch.Tensor, start: int, end: int, eos_id: int, mask_id: int, ended_at: torch.Tensor) -> bool:
    """``stop_after_eos`` at the end ``end`` of a block: set ``ended_at`` (B,) to ``end`` for the rows
    that have now ended (they decode no further: a row's tokens do not depend on the rows beside it).
    -> whether every row has ended."""
    newly = rows_ended(x, start, end, eos_id, mask_id) & (ended_at > end)  # (B,)
    ended_at[newly] = end
    return bool((ended_at <= end).all())


def fill_after(x: torch.Tensor, ended_at: torch.Tensor, eos_id: int, mask_id: int, stats: CommitStats,
               recorder: StepRecorder | None) -> torch.Tensor:
    """``stop_after_eos``: set every masked position of a row from its ``ended_at`` (B,) on to EOS,
    no forward (after the last step). -> new x"""
    pos = torch.arange(x.shape[1], device=x.device)  # (T,)
    filled = (x == mask_id) & (pos[None, :] >= ended_at[:, None])  # (B, T)
    stats.filled = float(filled.sum(-1).double().mean()) if filled.numel() else 0.0
    if recorder is not None and bool(filled.any()):
        recorder.on_fill(filled, eos_id)
    return x.masked_fill(filled, eos_id)


@torch.no_grad()
def generate(
    forward: Forward,
    prompt_ids: torch.Tensor,  # (B, P), left-padded
    prompt_mask: torch.Tensor | None,  # (B, P) 1 = real token, or None
    cfg: SamplerConfig,
    mask_id: int,
    noise: RowNoise | None = None,
    recorder: StepRecorder | None = None,
    *,
    net: nn.Module | None = None,
    eos_id: int | None = None,
    canvas: torch.Tensor | None = None,
    start_step: int = 0,
    stop_step: int | None = None,
) -> SampleOutput:
    """Run the remasking sampler; ``forward(ids, attention_mask) -> logits (B, T, V)``.

    ``kv_cache=prefix|dual`` need the network itself (``net``: see :class:`~diffusion_rl.models.policy.KVCacheLM`),
    ``stop_after_eos`` the EOS id. ``canvas`` (B, L): the completion to start from, the mask id at the
    positions to decode; any other token is pinned (a task's known tokens: never masked, sampled or
    committed, and each block commits its masked positions only); None: every position masked.
    ``noise``: each row's random numbers (``sampling/noise.py``; None: the global generator).

    ``start_step`` / ``stop_step`` (``decode=fixed`` only; a tree rollout's branches, ``rl/tree.py``):
    run the denoising steps ``start_step .. stop_step - 1`` of the schedule and return the state after
    them, still partly masked when ``stop_step < cfg.steps``. ``canvas`` then holds the state after
    ``start_step`` steps; a block entered part-way spreads its masked positions over the steps it has
    left, as the uninterrupted schedule does, so stopping and continuing with the same ``noise``
    gives the uninterrupted run's tokens (tests/unit/rl/test_dtreerpo.py).
    """
    B, P = prompt_ids.shape
    L, bl = cfg.gen_length, cfg.block_length
    if (cfg.stop_after_eos or cfg.eoser) and eos_id is None:
        raise ValueError("sampler.stop_after_eos and EOSER need the EOS id")
    stop, spb, fixed = schedule_part(cfg, start_step, stop_step), cfg.steps_per_block, cfg.decode == "fixed"
    x = torch.cat([prompt_ids, start_canvas(canvas, B, L, mask_id, prompt_ids)], 1)  # (B, T)
    attn = completion_attention(prompt_mask, L)  # (B, T) | None
    stats = CommitStats(B, P + L, prompt_ids.device)
    full = full_step(forward, attn, cfg, P, mask_id)
    source = step_logits(cfg.kv_cache, full, 2 if cfg.cfg_scale > 0 else 1, net, attn, stats.forward,
                         cfg.kv_cache_refresh, keep_full=recorder is not None)
    ended_at = torch.full((B,), P + L, dtype=torch.long, device=x.device)  # stop_after_eos: where a row ended
    # resumed in a later block: the rows that ended at the block ends already passed
    all_ended = cfg.stop_after_eos and _ended_before(x, P, bl, start_step // spb, eos_id, mask_id, ended_at)  # type: ignore[arg-type]
    step = start_step
    for b in range(start_step // spb, cfg.num_blocks):
        if all_ended or step >= stop:
            break
        start, end = P + b * bl, P + (b + 1) * bl
        live = ended_at > start  # (B,) the rows still decoding
        left = (b + 1) * spb - step if fixed else spb  # this block's steps not yet taken (all unless resumed in it)
        counts = block_schedule(cfg, x[:, start:end], mask_id, left, live)  # a view: sees the commits
        step = _denoise_block(x, source, counts, start, end, step, stop, live, cfg, mask_id, noise, eos_id, stats,
                              recorder)
        block_done = not fixed or step == (b + 1) * spb
        if cfg.stop_after_eos and block_done and end < P + L:
            all_ended = mark_ended(x, P, end, eos_id, mask_id, ended_at)  # type: ignore[arg-type]
    if cfg.stop_after_eos and (not fixed or stop == cfg.steps):  # a stopped state stays masked: its continuation fills it
        x = fill_after(x, ended_at, eos_id, mask_id, stats, recorder)  # type: ignore[arg-type]
    return stats.finish(x, x[:, P:])


def schedule_part(cfg: SamplerConfig, start_step: int, stop_step: int | None) -> int:
    """The step :func:`generate` stops before: ``stop_step`` (None: ``sampler.steps``) with
    ``decode=fixed``, no limit otherwise; a part of the schedule needs ``decode=fixed`` and
    ``0 <= start_step <= stop_step <= sampler.steps``."""
    fixed = cfg.decode == "fixed"
    stop = (cfg.steps if stop_step is None else stop_step) if fixed else torch.iinfo(torch.int64).max
    if (start_step, stop_step) != (0, None):
        if not fixed:
            raise ValueError(f"start_step / stop_step need sampler.decode=fixed, not {cfg.decode}")
        if not 0 <= start_step <= stop <= cfg.steps:
            raise ValueError(f"steps {start_step} .. {stop} must lie in 0 .. sampler.steps={cfg.steps}")
    return stop


def completion_attention(prompt_mask: torch.Tensor | None, gen_length: int) -> torch.Tensor | None:
    """(B, P + L) attention mask of a left-padded prompt and its completion; None when no prompt
    position is padding (the model then attends everywhere)."""
    if prompt_mask is None or bool(prompt_mask.all()):
        return None
    ones = torch.ones(prompt_mask.shape[0], gen_length, dtype=torch.long, device=prompt_mask.device)
    return torch.cat([prompt_mask.long(), ones], 1)


def _ended_before(x: torch.Tensor, start: int, bl: int, blocks: int, eos_id: int, mask_id: int,
                  ended_at: torch.Tensor) -> bool:
    """``stop_after_eos``: mark the rows ended at the ends of the first ``blocks`` blocks of the
    completion starting at ``start`` (in order, as the uninterrupted run did). -> whether all have ended"""
    ended = False
    for b in range(blocks):
        end = start + (b + 1) * bl
        ended = end < x.shape[1] and mark_ended(x, start, end, eos_id, mask_id, ended_at)
    return ended


def gumbel_dtype(cfg: SamplerConfig) -> torch.dtype:
    return torch.float64 if cfg.gumbel_dtype == "float64" else torch.float32


def _denoise_block(x: torch.Tensor, source: StepLogits, counts: Iterator[torch.Tensor | None], start: int, end: int, step: int,
                   stop: int, live: torch.Tensor, cfg: SamplerConfig, mask_id: int, noise: RowNoise | None,
                   eos_id: int | None, stats: CommitStats, recorder: StepRecorder | None) -> int:
    """The denoising steps of the block ``x[:, start:end]`` (``counts``: each step's commit counts),
    committed in place in ``x`` (B, T), up to the global step ``stop``. -> the next global step"""
    gdtype = gumbel_dtype(cfg)
    for i, k in enumerate(counts):
        if step >= stop:
            break
        off, logits = source(x, start, end, i)  # (B, R, V) over positions off .. off + R, the block inside
        blk = logits[:, start - off:end - off]  # (B, bl, V): candidates, confidences and noise only here
        cand, commit = denoise_step(blk, (x[:, start:end] == mask_id) & live[:, None], k, cfg, noise, gdtype,
                                    eos_scale_at(cfg, eos_id, step))
        stats.add(blk, commit, cand, start)
        if recorder is not None:
            recorder.on_step(step, x.clone(), *source.widen(x, logits, off, start, cand, commit))
        x[:, start:end] = torch.where(commit, cand, x[:, start:end])
        step += 1
    return step


def start_canvas(canvas: torch.Tensor | None, batch: int, length: int, mask_id: int, like: torch.Tensor) -> torch.Tensor:
    """The completion a sampler starts from: ``canvas`` (B, L) as given, or every position masked."""
    if canvas is None:
        return torch.full((batch, length), mask_id, dtype=like.dtype, device=like.device)
    if tuple(canvas.shape) != (batch, length):
        raise ValueError(f"canvas {tuple(canvas.shape)} must cover the completion ({batch}, {length})")
    return canvas.to(device=like.device, dtype=like.dtype)


def full_step(forward: Forward, attn: torch.Tensor | None, cfg: SamplerConfig, prompt_len: int,
              mask_id: int) -> Callable[[torch.Tensor, slice | None], torch.Tensor]:
    """The exact step, ``(ids, keep) -> logits at keep``: the forward itself, or with classifier-free
    guidance when ``cfg.cfg_scale > 0``."""
    if cfg.cfg_scale <= 0:
        return partial(logits_at, forward, attn=attn)
    return partial(guided_logits, forward, attn=attn, scale=cfg.cfg_scale, prompt_len=prompt_len, mask_id=mask_id)


def guided_logits(forward: Forward, x: torch.Tensor, keep: slice | None, *, attn: torch.Tensor | None, scale: float,
                  prompt_len: int, mask_id: int) -> torch.Tensor:
    """The logits of one full step at the positions ``keep`` (None: all) with classifier-free
    guidance (``scale > 0``): the conditional and the unconditional (prompt masked out) branches run in
    one batch; ``scale <= 0`` is the plain step. -> (B, R, V)"""
    if scale <= 0:
        return logits_at(forward, x, keep, attn=attn)
    un = x.clone()
    un[:, :prompt_len] = mask_id  # unconditional branch: the prompt is masked out
    both = logits_at(forward, torch.cat([x, un]), keep, attn=None if attn is None else torch.cat([attn, attn]))
    cond, uncond = both.chunk(2)
    return uncond + (scale + 1) * (cond - uncond)


def logits_at(forward: Forward, ids: torch.Tensor, keep: slice | None, *, attn: torch.Tensor | None) -> torch.Tensor:
    """``forward``'s logits at the positions ``keep`` (None: all); a policy forward computes only those
    (``models/policy.py: PolicyForward``), a plain callable is sliced. -> (B, R, V)"""
    if keep is None:
        return forward(ids, attn)
    if isinstance(forward, PolicyForward):  # its head runs at ``keep`` only
        return forward(ids, attn, keep=keep)
    return forward(ids, attn)[:, keep]


def completion_mask(completion: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for tokens up to and including the first EOS, 0 after it. (B, L) -> (B, L) float."""
    is_eos = completion == eos_id
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    return (~after).float()
