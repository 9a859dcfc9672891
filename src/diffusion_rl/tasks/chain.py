"""Digit chains: a synthetic task with long answers, for the sampler's speed/accuracy trade-offs
(``benchmarks/rollout.py``) and RL with 256-token completions on the embedded model.

Item ``{"start": "48213579", "lines": 12, "rule": "rotate"}``; compact prompt ``"12:48213579;"``;
answer the next ``lines`` lines of the chain, ``;``-separated (``rewards/chain.py``; ``rule=rotate``:
``"82135794;21357948;..."``, ``rule=sum``: ``next[k] = (cur[k] + cur[k+1]) mod 10``):
``9 * lines - 1`` characters, 35-179 with the default 4-20 lines of 8 digits, then EOS padding up to
``sampler.gen_length`` (256 in ``benchmarks/rollout.py``). Every answer token follows from the line
above it, so a line can be decoded in parallel once the line above is known: what
confidence-threshold decoding exploits, and what a stale key/value cache can get wrong. Start lines
are drawn with a seeded generator; train and test never share one. The rule rides on each item, so
the rewards need no task config.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diffusion_rl.errors import ConfigError
from diffusion_rl.rewards.chain import RULES, chain_lines, chain_metrics, chain_reward
from diffusion_rl.tasks.base import TASKS, RewardFn, Task, TaskConfig


@dataclass
class ChainConfig(TaskConfig):
    name: str = "chain"
    num_train: int = 20000
    width: int = 8  # digits per line
    min_lines: int = 4
    max_lines: int = 20  # 9 * 20 - 1 = 179 characters
    rule: str = "rotate"  # rotate (a copy of the line above, learned fast) | sum (two digits per digit)

    def validate(self) -> None:
        super().validate()
        if self.rule not in RULES:
            raise ConfigError("task.rule", self.rule, f"allowed: {', '.join(RULES)}")
        if self.num_train < 1:
            raise ConfigError("task.num_train", self.num_train, "must be >= 1")
        if self.width < 1:
            raise ConfigError("task.width", self.width, "must be >= 1")
        if not 1 <= self.min_lines <= self.max_lines <= 99:
            raise ConfigError("task.max_lines", self.max_lines,
                              f"must be in [task.min_lines={self.min_lines}, 99] with min_lines >= 1")


@TASKS.register("chain")
class ChainTask(Task):
    config_class = ChainConfig
    cfg: ChainConfig

    def _draw(self, n: int, tag: str, exclude: set[str]) -> list[dict[str, Any]]:
        c = self.cfg
        rng = random.Random(f"chain/{tag}/{c.seed}")
        out: dict[str, dict[str, Any]] = {}
        for _ in range(20 * n + 100):  # 10^width start lines: collisions are rare
            if len(out) == n:
                break
            start = "".join(rng.choice("0123456789") for _ in range(c.width))
            if start not in exclude and start not in out:
                out[start] = {"start": start, "lines": rng.randint(c.min_lines, c.max_lines), "rule": c.rule}
        return list(out.values())

    def test_items(self) -> list[dict[str, Any]]:
        return self._draw(self.cfg.num_test, "test", set())

    def train_items(self) -> list[dict[str, Any]]:
        return self._draw(self.cfg.num_train, "train", {it["start"] for it in self.test_items()})

    def prompt(self, item: dict[str, Any]) -> str:
        return f"{item['lines']:02d}:{item['start']};"

    def target(self, item: dict[str, Any]) -> str:
        return ";".join(chain_lines(item["start"], item["lines"], item["rule"]))

    def reward_functions(self) -> list[tuple[str, RewardFn, float]]:
        return [("lines", chain_reward, 1.0)]

    def metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        return chain_metrics(completions, [it["start"] for it in items], [it["lines"] for it in items],
                             [it["rule"] for it in items])
