"""The warm start: a short supervised masked-diffusion run that stands in for the papers' SFT stage.

RL needs a policy that is right some of the time. The embedded model is trained on (prompt, gold
completion) pairs with the masked-diffusion objective (LLaDA's SFT loss; a uniform-noise model,
DiffusionGemma: the uniform-noise denoising loss, ``likelihood/uniform_elbo.py``) for a fixed number of steps,
deliberately not to convergence: accuracy jumps from chance to near perfect within a few dozen steps
on Sudoku (docs/methods.md §8), so the cut is by step count, not time. The checkpoint is saved in
``paths.warmstart_dir`` under a key of every config value that shapes it, so a second run reuses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from diffusion_rl.core.config import renamed
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.uniform_elbo import denoising_loss
from diffusion_rl.models.policy import PolicyBundle, encode_prompts, logits_fn
from diffusion_rl.training.checkpoint import atomic_save  # write, fsync, rename

log = logging.getLogger(__name__)


@dataclass
class WarmStartConfig:
    enabled: bool = True
    # deliberately short of convergence, so RL has room to add. On the embedded Sudoku job (GRPO, per-cell
    # credit, RL seed 0, 200 RL steps) warm starts of 140 / 200 / 260 supervised steps went 0.833 -> 0.885,
    # 0.877 -> 0.927 and 0.942 -> 0.955 in validation cell accuracy: 200, the highest end with >= 5 points
    # added by RL. Every objective's job shares it (one warm start: the objective is not in its key)
    steps: int = 200
    batch_size: int = 128
    lr: float = 2e-3
    # what every RL seed of a comparison shares: the model's initial weights, this run and (conf/config.yaml
    # ties task.seed to it) the task's generated data; the RL seed is the root key `seed`
    seed: int = 0
    reuse: bool = True  # load a warm start trained with the same config from paths.warmstart_dir
    # "inverse_t": LLaDA's 1/t ELBO weighting; "mean" over masked tokens, which made SFT faster here
    weighting: str = "mean"
    cache: bool | None = None  # deprecated name of reuse, taken for one release with a warning

    def __post_init__(self) -> None:
        if self.cache is not None:
            self.reuse, self.cache = renamed("warmstart.cache", "warmstart.reuse", self.cache), None

    def validate(self) -> None:
        if self.weighting not in ("inverse_t", "mean"):
            raise ConfigError("warmstart.weighting", self.weighting, "allowed: inverse_t, mean")
        if self.steps < 0:
            raise ConfigError("warmstart.steps", self.steps, "must be >= 0")
        if self.batch_size < 1:
            raise ConfigError("warmstart.batch_size", self.batch_size, "must be >= 1")
        if self.lr <= 0:
            raise ConfigError("warmstart.lr", self.lr, "must be > 0")


def encode_targets(tokenizer, targets: list[str], gen_length: int, eos_id: int) -> torch.Tensor:
    """Gold completions as ids, EOS-padded (LLaDA's SFT convention) to ``gen_length``. -> (B, L)"""
    out = torch.full((len(targets), gen_length), eos_id, dtype=torch.long)
    for i, t in enumerate(targets):
        ids = tokenizer.encode(t, add_special_tokens=False)[:gen_length]
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def masked_diffusion_loss(forward, prompt_ids, prompt_mask, target_ids, mask_id: int,
                          generator: torch.Generator, t_min: float = 1e-3, weighting: str = "inverse_t",
                          pinned: torch.Tensor | None = None) -> torch.Tensor:
    """Mask each target token w.p. ``t ~ U(t_min, 1)``; cross-entropy on the masked tokens. ``pinned``
    (B, L): the task's known tokens (``Task.pinned_completion``), never masked (the sampler starts
    from them), so the model learns what RL asks of it: the free positions.

    ``weighting="inverse_t"`` is LLaDA's SFT loss (sum / t / L, the ELBO); ``"mean"`` averages over
    the masked tokens, which avoids the 1/t variance at small t and trains faster at this scale.
    """
    B, L = target_ids.shape
    t = t_min + (1 - t_min) * torch.rand(B, 1, generator=generator)  # (B, 1)
    hit = torch.rand(B, L, generator=generator) < t  # (B, L)
    if pinned is not None:
        hit = hit & ~pinned
    noisy = torch.where(hit, torch.full_like(target_ids, mask_id), target_ids)
    ids = torch.cat([prompt_ids, noisy], 1)
    attn = torch.cat([prompt_mask, torch.ones_like(target_ids)], 1)
    logits = forward(ids, attn)[:, prompt_ids.shape[1]:]  # (B, L, V)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target_ids, reduction="none")  # (B, L)
    if weighting == "mean":
        return (ce * hit).sum() / hit.sum().clamp_min(1)
    return ((ce * hit / t).sum(-1) / L).mean()


def numerics() -> dict[str, Any]:
    """What changes a warm start's sums besides its config: torch's version, its intra-op thread count (how
    a matmul splits its sums: the Sudoku warm start scores 0.883 trained on two threads, 0.879 on one) and the
    CPU instruction set its kernels were chosen for. Part of the cache key, so a cache shared by runs with
    other threads or another install never hands one of them the other's warm start."""
    return {"torch": str(torch.__version__), "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def cache_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_start(bundle: PolicyBundle, task, gen_length: int, cfg: WarmStartConfig,
               key_parts: dict[str, Any], folder: str | None, progress: bool = True) -> dict[str, Any]:
    """Train ``bundle.net`` in place (or load the one trained with the same config from ``folder``,
    ``paths.warmstart_dir``); returns the provenance record."""
    cfg.validate()
    parts = {"warmstart": asdict(cfg), "gen_length": gen_length, "numerics": numerics(), **key_parts}
    key = cache_key(parts)
    path = Path(folder) / f"{key}.pt" if folder else None
    if cfg.reuse and path is not None and path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        bundle.net.load_state_dict(blob["state_dict"])
        log.info("warm start loaded from %s", path)
        return {"key": key, "path": str(path), "reused": True, "steps": cfg.steps, "numerics": parts["numerics"]}
    items = task.splits.train
    gen = torch.Generator().manual_seed(cfg.seed)
    net = bundle.net
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=0.0)
    forward = logits_fn(net)
    bar = tqdm(range(cfg.steps), desc="warm start (SFT)", disable=not progress, leave=False)
    for _ in bar:
        idx = torch.randint(len(items), (cfg.batch_size,), generator=gen).tolist()
        batch = [items[i] for i in idx]
        p_ids, p_mask = encode_prompts(bundle.tokenizer, [task.prompt(it) for it in batch],
                                       pad_to_multiple_of=bundle.block_size)  # block models: whole prompt blocks
        tgt = encode_targets(bundle.tokenizer, [task.target(it) for it in batch], gen_length, bundle.eos_token_id)
        canvas = task.canvas(batch, bundle.tokenizer, gen_length, bundle.mask_token_id)
        pinned = None if canvas is None else canvas != bundle.mask_token_id
        if bundle.noise == "uniform":  # no mask token: the uniform-noise denoising loss (likelihood/uniform_elbo.py)
            loss = denoising_loss(forward, p_ids, p_mask, tgt, gen, pinned=pinned)
        else:
            loss = masked_diffusion_loss(forward, p_ids, p_mask, tgt, bundle.mask_token_id, gen,
                                         weighting=cfg.weighting, pinned=pinned)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    net.eval()
    if path is not None and cfg.reuse:
        atomic_save({"state_dict": net.state_dict(), "provenance": parts}, path)
    return {"key": key, "path": str(path) if path else None, "reused": False, "steps": cfg.steps,
            "numerics": parts["numerics"]}
