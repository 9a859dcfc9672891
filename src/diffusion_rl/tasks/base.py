"""The task interface shared by every benchmark, and the LightningDataModule that serves prompts.

A task turns raw items (dicts) into prompts, gold completions (for the warm start), rewards and
evaluation metrics. Reward functions follow TRL's signature
``fn(prompts: list[str], completions: list[str], **fields) -> list[float]`` where ``fields`` holds
one list per item column; they never raise and return in bounded time. A task's composite reward is
the weighted sum of its reward functions; a function that raises on one completion gives that
completion ``failure_reward`` instead of killing the run.
"""

from __future__ import annotations

import functools
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.registry import Registry
from diffusion_rl.rewards.answer import extract_answer
from diffusion_rl.tasks.order import ResumableLoader

log = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]
GENERATED_NUM_TEST = 256  # test items a task generates (Sudoku, Countdown) when task.num_test is null
TASKS: Registry[type[Task]] = Registry("task.name")
LOSS_MASKS = ("all", "reward")



@dataclass
class TaskConfig:
    """Fields every task shares. Task-specific configs subclass this."""

    name: str = "sudoku"
    group_size: int = 8  # G completions per prompt
    prompts_per_batch: int = 16  # prompts per rollout batch (rollout batch = prompts x G)
    # held-out items to evaluate: null = every item of task.data_path (or of the hub's test split),
    # and GENERATED_NUM_TEST where the task generates its test set; a number caps either
    num_test: int | None = None
    # validation items (tuning, eval.every_n_steps): disjoint from train and test. A task with a
    # natural validation split uses it; otherwise a seeded subset of the training pool is held out
    num_val: int = 256
    eval_batch_size: int = 128
    data_path: str | None = None  # local file instead of generated / hub data
    failure_reward: float = 0.0  # reward of a completion whose reward function raised
    # all: every completion token gets policy gradient | reward: only the tokens the reward reads
    # (Task.reward_token_mask; e.g. Sudoku's empty cells, not the givens the model copies)
    loss_mask: str = "all"
    seed: int = 0

    def validate(self) -> None:
        if self.group_size < 2:
            raise ConfigError("task.group_size", self.group_size, "must be >= 2 (advantages are group-relative)")
        if self.prompts_per_batch < 1:
            raise ConfigError("task.prompts_per_batch", self.prompts_per_batch, "must be >= 1")
        if self.num_test is not None and self.num_test < 1:
            raise ConfigError("task.num_test", self.num_test, "must be >= 1, or null (every item of a file)")
        if self.eval_batch_size < 1:
            raise ConfigError("task.eval_batch_size", self.eval_batch_size, "must be >= 1")
        if self.num_val < 0:
            raise ConfigError("task.num_val", self.num_val, "must be >= 0 (0 = no validation split)")
        if self.loss_mask not in LOSS_MASKS:
            raise ConfigError("task.loss_mask", self.loss_mask, f"allowed: {', '.join(LOSS_MASKS)}")

    @property
    def generated_num_test(self) -> int:
        """How many test items to generate (or hold out of a training split)."""
        return self.num_test if self.num_test is not None else GENERATED_NUM_TEST


class Splits(NamedTuple):
    train: list[dict[str, Any]]  # what the warm start and RL use
    validation: list[dict[str, Any]]  # tuning and evaluations during training
    test: list[dict[str, Any]]  # what reports quote


# metrics every evaluation reports besides the task's own
COMMON_METRICS = {
    "reward": "mean over items of the task's composite training reward (task.rewards)",
    "num_items": "how many test items were scored",
}


class Task(ABC):
    """One benchmark. Subclasses register with ``@TASKS.register("name")``."""

    config_class: type[TaskConfig] = TaskConfig
    #: one line per metric that :meth:`metrics` returns, printed with the results (docs/tasks.md, "Metrics")
    metric_help: dict[str, str] = {}

    def __init__(self, cfg: TaskConfig):
        cfg.validate()
        self.cfg = cfg
        self._warned: set[str] = set()
        self.reward_failures = 0  # completions that got failure_reward because a reward function raised

    # ---- data ---------------------------------------------------------------------------
    @abstractmethod
    def train_items(self) -> list[dict[str, Any]]:
        """The training pool; disjoint from :meth:`test_items`. Training uses ``splits.train``."""

    @abstractmethod
    def test_items(self) -> list[dict[str, Any]]:
        """Held-out items for evaluation: all of ``task.data_path`` unless ``cfg.num_test`` caps them."""

    def validation_items(self) -> list[dict[str, Any]] | None:
        """A natural validation split (disjoint from train and test), or None: :attr:`splits` then
        holds out ``num_val`` seeded items of the training pool."""
        return None

    @functools.cached_property
    def splits(self) -> Splits:
        """Train / validation / test items, pairwise disjoint, computed once."""
        pool, test, val = self.train_items(), self.test_items(), self.validation_items()
        if val is not None:
            return Splits(pool, val[: self.cfg.num_val], test)
        n_val = min(self.cfg.num_val, len(pool) // 10)  # never more than a tenth of the pool
        held = set(random.Random(f"{self.cfg.name}/validation/{self.cfg.seed}").sample(range(len(pool)), n_val))
        return Splits([it for i, it in enumerate(pool) if i not in held], [pool[i] for i in sorted(held)], test)

    def reward_token_mask(self, item: dict[str, Any], tokens: list[str]) -> list[bool] | None:
        """Which completion tokens (their decoded texts, in order) the reward reads, for
        ``task.loss_mask=reward``; None: all of them (the default for tasks that do not say)."""
        return None

    def pinned_completion(self, item: dict[str, Any]) -> list[str | None] | None:
        """The completion's tokens a task knows in advance, as texts, one per completion position from
        the first (None where the model decides; positions past the list are free); None: nothing
        pinned (the default). Pinned tokens start in the sampler's canvas and are never masked,
        sampled or scored: diffusion-native infilling (``Task.canvas``)."""
        return None

    def canvas(self, items: Sequence[dict[str, Any]], tokenizer: Any, length: int, mask_id: int) -> torch.Tensor | None:
        """(B, L) the completions the sampler starts from: each item's pinned tokens, the mask id
        elsewhere; None when no item pins anything. A pinned text must be one token of ``tokenizer``."""
        rows = [self.pinned_completion(it) for it in items]
        if all(r is None for r in rows):
            return None
        out = torch.full((len(items), length), mask_id, dtype=torch.long)
        for b, row in enumerate(rows):
            for i, text in enumerate((row or [])[:length]):
                if text is not None:
                    out[b, i] = single_token(tokenizer, text)
        return out

    def hint_reference(self, item: dict[str, Any]) -> str | list[str]:
        """The reference completion a hint is cut from (IGPO's inpainting, ``rl/objectives/igpo.py``): a
        text, tokenized and cut into chunks placed with their gaps stretched to the canvas, or one token
        text per completion position from the first (a task whose answer has fixed cells: Sudoku's
        solution). A task with no reference says so here."""
        raise ConfigError("task.name", self.cfg.name, "has no reference completion to cut IGPO hints from")

    def correctness(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> list[bool]:
        """Whether each completion is right (IGPO's all-wrong test); a task with no such notion says so."""
        raise ConfigError("task.name", self.cfg.name, "does not say which completions are right (IGPO needs it)")

    def token_rewards(self, item: dict[str, Any], tokens: list[str]) -> list[float] | None:
        """The reward earned by each completion token, summing to the completion's reward, for
        ``advantage=per_token``; None: the reward does not split over tokens (the default)."""
        return None

    @abstractmethod
    def prompt(self, item: dict[str, Any]) -> str:
        """The text the model is conditioned on."""

    @abstractmethod
    def target(self, item: dict[str, Any]) -> str:
        """A gold completion in the task's answer format (warm start, reference policy)."""

    # ---- rewards ------------------------------------------------------------------------
    @abstractmethod
    def reward_functions(self) -> list[tuple[str, RewardFn, float]]:
        """``(name, fn, weight)`` triples; the composite reward is the weighted sum."""

    def score(self, completions: Sequence[str],
              items: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Composite reward per completion ``(N,)`` and each function's unweighted values ``{name: (N,)}``;
        a function that raises costs one completion (``failure_reward``), not the batch."""
        prompts = [self.prompt(it) for it in items]
        fields = {k: [it.get(k) for it in items] for k in items[0]} if items else {}
        total = torch.zeros(len(completions), dtype=torch.float32)
        components: dict[str, torch.Tensor] = {}
        for name, fn, weight in self.reward_functions():
            try:
                values = fn(prompts, list(completions), **fields)
            except Exception:  # noqa: BLE001 - fall back to one call per completion
                values = [self._one_reward(name, fn, p, c, it) for p, c, it in zip(prompts, completions, items)]
            components[name] = torch.tensor(values, dtype=torch.float32)
            total += weight * components[name]
        return total, components

    def reward_metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        """``reward/*`` metrics of a rollout's completions, means over them, right after :meth:`score`
        (the code tasks' ``reward/timeout_frac``); none by default."""
        return {}

    def rewards(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> torch.Tensor:
        """Composite reward per completion, shape ``(N,)``."""
        return self.score(completions, items)[0]

    def _one_reward(self, name: str, fn: RewardFn, prompt: str, completion: str, item: dict) -> float:
        try:
            return float(fn([prompt], [completion], **{k: [v] for k, v in item.items()})[0])
        except Exception as err:  # noqa: BLE001 - a reward bug must not kill a long run
            self.reward_failures += 1
            if name not in self._warned:  # once per function: a bug would otherwise flood the log
                self._warned.add(name)
                log.warning("reward %s raised %s on completion %r; using failure_reward (logged once)",
                            name, _short(repr(err)), _short(completion))
            return self.cfg.failure_reward

    @abstractmethod
    def metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Evaluation metrics averaged over items (e.g. ``cell_accuracy``, ``solved_rate``)."""

    def metric_definitions(self) -> dict[str, str]:
        """``{metric: one-line definition}`` for every metric an evaluation of this task reports."""
        return {**self.metric_help, **{k: v for k, v in COMMON_METRICS.items() if k not in self.metric_help}}

    # ---- evaluation protocol (``diffusion_rl.app.evaluate``); the defaults suit compact prompts --------
    def use_tokenizer(self, tokenizer: Any) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Give the policy's tokenizer to tasks whose prompts use its chat template."""

    def eval_prompt(self, item: dict[str, Any]) -> str:
        """The prompt at evaluation (the papers use a different template than in training)."""
        return self.prompt(item)

    @property
    def eval_prefill(self) -> str:
        """Text ending :meth:`eval_prompt` that belongs to the response (d1's ``<reasoning>``)."""
        return ""

    def gold(self, item: dict[str, Any]) -> str:
        """The gold answer as written in the generations file."""
        return self.target(item)

    def parse(self, completion: str) -> str:
        """The answer the rewards read from a completion."""
        return extract_answer(completion)

    def details(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Extra fields per completion for the generations files (the code tasks' sandbox verdict)."""
        return [{} for _ in completions]


def single_token(tokenizer: Any, text: str) -> int:
    """The id of ``text`` as one token; a text the tokenizer splits cannot be pinned to one position."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError("task.pin", text, f"pins one completion position, but the tokenizer makes {len(ids)} tokens of it")
    return int(ids[0])


class _Items(Dataset):
    def __init__(self, items: list[dict[str, Any]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def _short(text: str, limit: int = 200) -> str:
    """At most ``limit`` characters of ``text`` for a log line (model output can be megabytes)."""
    return text if len(text) <= limit else f"{text[:limit]}...[{len(text) - limit} more chars]"


def _collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch  # items stay dicts; the module tokenises prompts itself


class TaskDataModule(L.LightningDataModule):
    """Serves batches of ``prompts_per_batch`` training items, shuffled by a generator seeded with
    ``seed`` (the run's RL seed; the items themselves come from ``task.seed``)."""

    def __init__(self, task: Task, oversample: int = 1, seed: int = 0):
        super().__init__()
        self.task, self.oversample, self.seed = task, oversample, seed  # prompts per step: prompts_per_batch x oversample
        self._train: list[dict[str, Any]] | None = None
        self._test: list[dict[str, Any]] | None = None

    def setup(self, stage: str | None = None) -> None:
        if self._train is None:
            self._train, _, self._test = self.task.splits
            if not self._train:
                raise ConfigError("task", self.task.cfg.name, "has no training items")

    def train_dataloader(self) -> DataLoader:
        """Seeded per epoch and resumable mid-epoch: Lightning checkpoints its position (tasks/order.py)."""
        assert self._train is not None
        return ResumableLoader(
            _Items(self._train),
            batch_size=self.task.cfg.prompts_per_batch * self.oversample,
            seed=self.seed,
            drop_last=len(self._train) >= self.task.cfg.prompts_per_batch * self.oversample,
            collate_fn=_collate,
        )

    def test_items(self) -> list[dict[str, Any]]:
        self.setup()
        assert self._test is not None
        return self._test

    def validation_items(self) -> list[dict[str, Any]]:
        return self.task.splits.validation

