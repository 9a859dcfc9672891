"""Greedy evaluation of a policy on a task's items, batched, with a progress bar; during RL every
``eval.every_n_steps`` optimizer steps (:class:`PeriodicEval`, ``eval/<metric>`` in the loggers)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import lightning as L
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
    extra = task.details(completions, items)
    records = [{"prompt": p, "completion": c, "reward": r, **it, **x}
               for p, c, r, it, x in zip(prompts, completions, rewards, items, extra)]
    return metrics, records


class PeriodicEval(L.Callback):
    """Held-out metrics during training: the warm start's at step 0 (``before``) and the final
    policy's (:meth:`record`, called by ``train``) on the test items as ``eval/<metric>``; every
    ``every_n_steps`` optimizer steps (and at step 0) on the validation split (``periodic_items``)
    as ``val/<metric>``, so curves and tuning never read the test set. Greedy decoding draws no
    random numbers: an evaluated run trains exactly as one that is not.

    Evaluates on the first process only when a single process trains (the weights are whole there);
    with several processes it evaluates before and after RL only.
    """

    def __init__(self, task, items: list[dict[str, Any]], sampler: SamplerConfig, batch_size: int,
                 every_n_steps: int, before: dict[str, float] | None = None,
                 periodic_items: list[dict[str, Any]] | None = None):
        self.task, self.items, self.sampler, self.batch_size = task, items, sampler, batch_size
        self.every_n_steps, self.before = every_n_steps, before
        self.periodic_items = items if periodic_items is None else periodic_items
        self.prefix = "eval" if periodic_items is None else "val"
        self.logged_step = -1  # rides in checkpoints: a resumed run evaluates at the same steps
        self.history: list[dict[str, float]] = []  # the periodic rows: {"step": s, "val/<metric>": v}

    def state_dict(self) -> dict[str, Any]:
        return {"logged_step": self.logged_step, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.logged_step = int(state_dict.get("logged_step", -1))
        self.history = list(state_dict.get("history", []))

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:  # a resumed run logged these already
            if self.before is not None:
                self.record(trainer, self.before)
            if self.every_n_steps:
                self._periodic(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, every = trainer.global_step, self.every_n_steps
        if not every or step // every <= self.logged_step // every or trainer.world_size > 1:
            return
        self._periodic(trainer, pl_module)

    def _periodic(self, trainer, pl_module) -> None:
        if trainer.world_size > 1 or not self.periodic_items:
            return
        metrics, _ = evaluate(pl_module.bundle, self.task, self.periodic_items, self.sampler, self.batch_size, desc=None)
        self.record(trainer, metrics, self.prefix)

    def record(self, trainer, metrics: dict[str, float], prefix: str = "eval") -> None:
        """``<prefix>/<metric>`` at the current optimizer step, written to disk now."""
        step = trainer.global_step
        if not trainer.is_global_zero:
            return
        self.logged_step = step
        row = {f"{prefix}/{k}": float(v) for k, v in metrics.items()}
        if prefix != "eval":
            self.history.append({"step": float(step), **row})
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
)


@contextmanager
def expected_warnings_silenced() -> Iterator[None]:
    """Silence :data:`EXPECTED_WARNINGS` (and only them) inside the block."""
    with warnings.catch_warnings():
        for pattern in EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        yield
