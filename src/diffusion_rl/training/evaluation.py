"""Greedy evaluation of a policy on a task's items, batched, with a progress bar; during RL before the
first update, every ``eval.every_n_steps`` optimizer steps and after the last one
(:class:`PeriodicEval`, ``eval/<metric>`` and ``val/<metric>`` in the loggers).

Every evaluation of a training run happens inside the fit, on the strategy's device (an 8B model is
never evaluated where it was loaded, nor after Lightning's teardown moved it back to the CPU), in
batches of ``eval.batch_size`` prompts. Under data parallelism each process generates the
completions of its share of the items (every ``W``-th), the completions are gathered in item order
and the first process scores them, so the metrics equal a one-process evaluation of the same
completions; under FSDP the weights are gathered once per evaluation (``training/strategy.py``
:func:`~diffusion_rl.training.strategy.gathered`), so processes may take different numbers of batches.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from diffusion_rl.core.seeding import mix_seed
from diffusion_rl.models.policy import PolicyBundle, decode_completions, encode_prompts
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.training.strategy import gathered

_EVAL_SALT = 0xE7A1


@torch.no_grad()
def generate_texts(bundle: PolicyBundle, prompts: list[str], sampler: SamplerConfig, batch_size: int,
                   rows: list[int] | None = None, desc: str | None = None,
                   canvas: torch.Tensor | None = None, noise_key: int = 0) -> list[str]:
    """Completions of ``prompts``, ``batch_size`` at a time; ``canvas`` (N, L): each one's pinned tokens
    (``Task.canvas``), or None. ``rows``: each prompt's id, which with ``noise_key`` keys its random
    numbers (the remasking order of ``remasking=random``, a uniform-noise sampler's canvases and draws;
    greedy decoding draws none); None: its index here. A completion does not depend on ``batch_size``
    through them."""
    rows = list(range(len(prompts))) if rows is None else rows
    net = bundle.net
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    out: list[str] = []
    starts = range(0, len(prompts), batch_size)
    with gathered(net):  # FSDP: one all-gather for every batch below; a no-op otherwise
        for s in tqdm(starts, desc=desc, disable=desc is None, leave=False):
            ids, mask = encode_prompts(bundle.tokenizer, prompts[s : s + batch_size], device, bundle.block_size)
            noise = RowNoise([mix_seed(_EVAL_SALT + noise_key, r) for r in rows[s : s + batch_size]])
            res = sample(bundle, ids, mask, sampler, noise,
                         canvas=None if canvas is None else canvas[s : s + batch_size].to(device))
            out += decode_completions(bundle.tokenizer, res.completion, bundle.eos_token_id)
    net.train(was_training)
    return out


def _group() -> tuple[int, int]:
    """(rank, number of processes) of the default process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def evaluate(bundle: PolicyBundle, task, items: list[dict[str, Any]], sampler: SamplerConfig,
             batch_size: int, desc: str | None = "evaluating",
             noise_key: int = 0) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy (``temperature = 0``) generations, the task's metrics, and one record per item.
    ``noise_key`` (``eval.noise_key``) keys the random numbers a sampler still draws at temperature 0
    (random remasking, a uniform-noise sampler): another key is another draw of the same evaluation.

    With several processes every process must call it (each generates its share of ``items``); all
    return the same metrics, the first process the records (the others an empty list)."""
    rank, world = _group()
    greedy = replace(sampler, temperature=0.0)
    mine = items[rank::world]
    canvas = task.canvas(mine, bundle.tokenizer, greedy.gen_length, bundle.mask_token_id) if mine else None
    texts = generate_texts(bundle, [task.prompt(it) for it in mine], greedy, batch_size,
                           rows=list(range(rank, len(items), world)), desc=desc if rank == 0 else None, canvas=canvas,
                           noise_key=noise_key)
    if world > 1:  # every process's completions, back in item order
        parts: list[list[str]] = [[] for _ in range(world)]
        dist.all_gather_object(parts, texts)
        texts = [parts[i % world][i // world] for i in range(len(items))]
    result: list[Any] = [None]
    if rank == 0:  # rewards may be expensive (code tasks run programs): scored once
        result = [score(task, items, texts)]
    if world > 1:
        dist.broadcast_object_list(result, src=0)
    metrics, records = result[0]
    return metrics, records if rank == 0 else []


def score(task, items: list[dict[str, Any]], completions: list[str]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The task's metrics of ``completions`` and one record per item (prompt, completion, reward, gold)."""
    prompts = [task.prompt(it) for it in items]
    metrics = task.metrics(completions, items)
    rewards = task.rewards(completions, items).tolist()
    extra = task.details(completions, items)
    records = [{"prompt": p, "completion": c, "reward": r, **it, **x}
               for p, c, r, it, x in zip(prompts, completions, rewards, items, extra)]
    return metrics, records


class PeriodicEval(L.Callback):
    """Held-out metrics during training, inside the fit on the training device.

    - before the first update (``before``), on the test items, as ``eval/<metric>`` at step 0;
    - every ``every_n_steps`` optimizer steps (and at step 0) on the validation split
      (``periodic_items``) as ``val/<metric>``, so curves and tuning never read the test set;
    - after the last update (``after``), on the test items, as ``eval/<metric>``; its records (one per
      item) are kept in :attr:`records` for ``eval_generations.jsonl``.

    Evaluation draws nothing from the global generator (greedy decoding draws no random numbers,
    random remasking draws from generators keyed by item): an evaluated run trains exactly as one
    that is not. A resumed run keeps the ``before`` metrics and the validation history of the run it continues
    (they ride in the checkpoint) and evaluates at the same steps.
    """

    def __init__(self, task, items: list[dict[str, Any]], sampler: SamplerConfig, batch_size: int,
                 every_n_steps: int, before: bool = True, after: bool = True,
                 periodic_items: list[dict[str, Any]] | None = None, progress: bool = False, noise_key: int = 0):
        self.task, self.items, self.sampler, self.batch_size = task, items, sampler, batch_size
        self.noise_key = noise_key
        self.every_n_steps, self.do_before, self.do_after, self.progress = every_n_steps, before, after, progress
        self.periodic_items = items if periodic_items is None else periodic_items
        self.prefix = "eval" if periodic_items is None else "val"
        self.logged_step = -1  # rides in checkpoints: a resumed run evaluates at the same steps
        self.history: list[dict[str, float]] = []  # the periodic rows: {"step": s, "val/<metric>": v}
        self.before: dict[str, float] | None = None
        self.after: dict[str, float] | None = None
        self.records: list[dict[str, Any]] = []  # the test items after RL (first process)

    def state_dict(self) -> dict[str, Any]:
        return {"logged_step": self.logged_step, "history": self.history, "before": self.before}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.logged_step = int(state_dict.get("logged_step", -1))
        self.history = list(state_dict.get("history", []))
        self.before = state_dict.get("before")

    def _run(self, pl_module, items: list[dict[str, Any]], desc: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
        return evaluate(pl_module.bundle, self.task, items, self.sampler, self.batch_size,
                        desc if self.progress else None, self.noise_key)

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:  # a resumed run evaluated these already
            if self.do_before:
                self.before, _ = self._run(pl_module, self.items, "evaluating before RL")
                self.record(trainer, self.before)
            if self.every_n_steps:
                self._periodic(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, every = trainer.global_step, self.every_n_steps
        if every and step // every > self.logged_step // every:
            self._periodic(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.do_after:
            self.after, self.records = self._run(pl_module, self.items, "evaluating after RL")
            self.record(trainer, self.after)

    def _periodic(self, trainer, pl_module) -> None:
        if not self.periodic_items:
            return
        metrics, _ = self._run(pl_module, self.periodic_items, "evaluating (validation)")
        self.record(trainer, metrics, self.prefix)

    def record(self, trainer, metrics: dict[str, float], prefix: str = "eval") -> None:
        """``<prefix>/<metric>`` at the current optimizer step, written to disk now."""
        step = trainer.global_step
        self.logged_step = step
        row = {f"{prefix}/{k}": float(v) for k, v in metrics.items()}
        if prefix != "eval":
            self.history.append({"step": float(step), **row})
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.log_metrics(row, step=step)
            logger.save()
# Lightning warnings every run would print, each expected here (the reason next to it)
EXPECTED_WARNINGS = (
    # the frozen old-policy and reference copies are in eval mode on purpose
    r"Found \d+ module\(s\) in eval mode at the start of training",
    # Lightning 2.6 calls a pytree API that torch 2.13 deprecates; nothing to change on our side
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # metrics.csv goes into the run folder, which always holds Hydra's files; a resumed run keeps
    # its rows up to the checkpoint (checkpoint.continue_csv_log) and nothing else is there to delete
    r"Experiment logs directory .* exists and is not empty",
    # FSDP2 (trainer=fsdp): every decoder layer returns its keys/values (views) for the sampler's
    # cache beside its output; nothing modifies them in place, which is what the warning is about
    r"FSDP2-wrapped module \(.*\) returned a view tensor",
)


@contextmanager
def expected_warnings_silenced() -> Iterator[None]:
    """Silence :data:`EXPECTED_WARNINGS` (and only them) inside the block."""
    with warnings.catch_warnings():
        for pattern in EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        yield
