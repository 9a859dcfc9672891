"""Fault injection (``conf/fault/``): break a run on purpose to check that it survives or resumes.

``python src/train.py fault=nan_grad fault.at_step=3``. ``fault.kind``:

- ``none``: nothing (the default).
- ``raise``: raise :class:`InjectedFault` at the start of the first training batch after ``at_step``
  optimizer steps (the checkpoint of step ``at_step``, if one is due, is on disk by then).
- ``kill``: ``SIGKILL`` the process at that point: no cleanup, no flush, like a preempted machine.
- ``nan_loss``: the loss of ``times`` updates, from optimizer step ``at_step`` on, becomes NaN.
- ``nan_grad``: after backward, one gradient entry of ``times`` updates becomes NaN.
- ``reward_raises``: from step ``at_step`` on, the task's first reward function raises on a batch and
  then on completions ``0, every, 2*every, ...`` of each rollout, with the whole completion in the
  exception's message (as ``int(text)`` would).
- ``truncate_ckpt``: once the checkpoint ``target`` (``last`` or ``step``, the step-``at_step`` file)
  exists after step ``at_step``, cut it to half its size.

A Lightning callback that wraps from outside: the NaN loss wraps the objective's ``loss_parts`` and
the reward fault the task's reward functions (both undone at teardown); the rest use Lightning's
hooks. The module knows nothing of faults. What the run does under each fault: docs/resume_and_faults.md.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rl.objectives.base import Objective, StepContext

log = logging.getLogger(__name__)

KINDS = ("none", "raise", "kill", "nan_loss", "nan_grad", "reward_raises", "truncate_ckpt")


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` and ``reward_raises`` faults."""


@dataclass
class FaultConfig:
    kind: str = "none"
    at_step: int = 1  # optimizer steps done before the fault fires
    times: int = 1  # nan_loss / nan_grad: how many updates are poisoned
    every: int = 2  # reward_raises: completions 0, every, 2*every, ... of a rollout raise
    target: str = "last"  # truncate_ckpt: "last" or "step" (the checkpoint of step at_step)

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("fault.kind", self.kind, f"allowed: {', '.join(KINDS)}")
        if self.at_step < 0:
            raise ConfigError("fault.at_step", self.at_step, "must be >= 0")
        if self.times < 1:
            raise ConfigError("fault.times", self.times, "must be >= 1")
        if self.every < 1:
            raise ConfigError("fault.every", self.every, "must be >= 1")
        if self.target not in ("last", "step"):
            raise ConfigError("fault.target", self.target, "allowed: last, step")


class FaultInjector(L.Callback):
    def __init__(self, cfg: FaultConfig):
        cfg.validate()
        self.cfg = cfg
        self.fired = 0  # poisoned updates / raised completions / 1 once a one-shot fault fired
        self._step = 0  # global step seen at the last batch start
        self._calls = 0  # reward_raises: per-completion calls since the last batch call
        self._task = None
        self._objective: Objective | None = None
        self._training = False

    # ---- wiring -------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.cfg.kind == "reward_raises":
            self.wrap_rewards(pl_module.task)
        if self.cfg.kind == "nan_loss":
            self.wrap_loss(pl_module.objective)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._objective is not None:
            del self._objective.loss_parts  # the instance attribute: back to the class method
            self._objective = None
        if self._task is not None:
            del self._task.reward_functions  # the instance attribute: back to the class method
            self._task = None

    # ---- step-triggered faults ----------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step, self._training = trainer.global_step, True
        kind, due = self.cfg.kind, trainer.global_step >= self.cfg.at_step
        if kind == "truncate_ckpt":
            self._maybe_truncate(trainer)
        elif due and not self.fired and kind in ("raise", "kill"):
            self.fired = 1
            if kind == "kill":
                log.warning("fault injection: SIGKILL after %d optimizer steps", trainer.global_step)
                os.kill(os.getpid(), signal.SIGKILL)
            raise InjectedFault(f"injected fault after {trainer.global_step} optimizer steps")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._training = False

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.cfg.kind == "truncate_ckpt":
            self._maybe_truncate(trainer)

    def _due_update(self, step: int) -> bool:
        if step >= self.cfg.at_step and self.fired < self.cfg.times:
            self.fired += 1
            return True
        return False

    # ---- losses -------------------------------------------------------------------------
    def wrap_loss(self, objective: Objective) -> None:
        """Make ``objective``'s loss parts NaN on ``times`` updates from step ``at_step`` on: the
        module sees them as it sees a real non-finite loss, before its backward."""
        inner = objective.loss_parts

        def loss_parts(ctx: StepContext) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
            for part, metrics in inner(ctx):
                yield (part * float("nan") if self._due_update(ctx.step) else part), metrics

        objective.loss_parts = loss_parts  # type: ignore[method-assign]
        self._objective = objective

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.cfg.kind == "nan_grad" and self._due_update(trainer.global_step):
            p = next(p for p in pl_module.policy.parameters() if p.grad is not None)
            p.grad.view(-1)[0] = float("nan")

    # ---- rewards ------------------------------------------------------------------------
    def wrap_rewards(self, task) -> None:
        """Make ``task``'s first reward function raise as described in the module docstring."""
        inner = task.reward_functions

        def reward_functions():
            fns = list(inner())
            name, fn, weight = fns[0]
            return [(name, self._faulty(fn), weight)] + fns[1:]

        task.reward_functions = reward_functions
        self._task = task

    def _faulty(self, fn):
        def faulty(prompts, completions, **fields):
            if not self._training or self._step < self.cfg.at_step:
                return fn(prompts, completions, **fields)
            if len(completions) > 1:  # the batch call: one bad completion sinks it
                self._calls = 0
                raise InjectedFault("a completion in this batch could not be scored")
            i, self._calls = self._calls, self._calls + 1
            if i % self.cfg.every == 0:
                self.fired += 1
                raise InjectedFault(f"cannot score completion {completions[0]!r}")
            return fn(prompts, completions, **fields)

        return faulty

    # ---- checkpoints --------------------------------------------------------------------
    def _maybe_truncate(self, trainer) -> None:
        if self.fired or trainer.global_step < self.cfg.at_step or trainer.checkpoint_callback is None:
            return
        folder = Path(trainer.checkpoint_callback.dirpath)
        if self.cfg.target == "last":
            path = folder / "last.ckpt"
        else:
            matches = [p for p in folder.glob("*.ckpt") if not p.name.startswith("last")
                       and [int(n) for n in re.findall(r"\d+", p.stem)][-1:] == [self.cfg.at_step]]
            path = matches[0] if matches else folder / "missing.ckpt"
        if path.is_file():
            size = path.stat().st_size
            os.truncate(path, size // 2)
            self.fired = 1
            log.warning("fault injection: truncated %s from %d to %d bytes", path, size, size // 2)
