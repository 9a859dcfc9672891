"""MATH500: competition problems with LaTeX answers, checked by ``math-verify``
(docs/methods.md §5).

Test items are rows of ``HuggingFaceH4/MATH-500`` (``problem``, ``solution``, ``answer``, ``subject``,
``level``, ``unique_id``), or a local JSONL of the same schema (``task.data_path``). MATH-500 is a
subset of the MATH *test* split, so training problems come from the MATH *train* split:
``EleutherAI/hendrycks_math`` (the original dataset's 7,500 training problems in 7 subject configs,
columns ``problem``, ``level``, ``type``, ``solution``; the answer is the solution's last
``\\boxed{}``), chosen because it is the MATH mirror lm-evaluation-harness loads and is disjoint
from MATH-500 by construction. A local training JSONL (``task.train_data_path``) needs ``problem``
and ``answer`` or ``solution``. Training items never repeat a test problem.

Rewards (``task.rewards``): ``d1_fixed`` (the default for chat prompts) = ``format`` (0.5 for an
``<answer>`` holding a ``\\boxed{}``) + ``correct`` (2.0 when math-verify finds the answer equivalent
to the gold); ``d1`` = d1's own two functions (string-normalised equality, and a format term of
0.75 / 0.25 whose box test never passes: ``rewards/d1/rewards.py``); ``plain`` = ``correct``.
``correct`` (training reward and the evaluation's ``accuracy`` alike) runs math-verify in a pool of
``task.verify_workers`` processes with ``task.verify_timeout_s`` per parse and check (10 s, measured
so that no right MATH-500 answer is lost on a loaded machine: ``rewards/verify_pool.py``), so a
verdict does not depend on the machine's load. The chat target's answer is ``\\boxed{gold}``; the
compact target is the bare answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards import math500 as math_rewards  # module object: see tasks/text.py
from diffusion_rl.rewards import verify_pool
from diffusion_rl.rewards.d1 import rewards as d1_rewards
from diffusion_rl.tasks.base import TASKS, RewardFn
from diffusion_rl.tasks.loading import load_hub, load_jsonl, load_rows, seeded_subset
from diffusion_rl.tasks.text import MATH_EXPERT, TextTask, TextTaskConfig, format_catalogue

MATH_SUBJECTS = [
    "algebra", "counting_and_probability", "geometry", "intermediate_algebra",
    "number_theory", "prealgebra", "precalculus",
]


# d1's MATH training prompt: its format prompt asking for the answer in \boxed{}
BOXED_TRAIN_SYSTEM = (MATH_EXPERT + "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n"
                      "<answer>\n\\boxed{...}\n</answer>")


@dataclass
class Math500Config(TextTaskConfig):
    name: str = "math500"
    eval_batch_size: int = 64  # chat prompts of up to 512 generated tokens
    compact_template: str = "{problem}\nA:"
    chat_train_system: str = BOXED_TRAIN_SYSTEM
    chat_user_template: str = "{problem}"
    hub_id: str = "HuggingFaceH4/MATH-500"
    hub_config: str | None = None
    train_hub_id: str = "EleutherAI/hendrycks_math"
    train_hub_configs: list[str] = field(default_factory=lambda: list(MATH_SUBJECTS))
    verify_workers: int = 0  # math-verify worker processes (rewards/verify_pool.py); 0: the CPU count, at most 8
    verify_timeout_s: float = verify_pool.DEFAULT_TIMEOUT_S  # per parse and per check (measured: docs/scoring.md, "Rewards under load")

    def validate(self) -> None:
        super().validate()
        if self.verify_workers < 0:
            raise ConfigError("task.verify_workers", self.verify_workers, "must be >= 0 (0: the CPU count)")
        if self.verify_timeout_s <= 0:
            raise ConfigError("task.verify_timeout_s", self.verify_timeout_s, "must be > 0")


def _item(row: dict[str, Any], where: str) -> dict[str, Any] | None:
    """``{"problem", "answer", "solution"}``; the answer from ``solution``'s last box if absent."""
    answer = row.get("answer")
    solution = row.get("solution") or ""
    if not answer:
        answer = math_rewards.last_boxed(solution) if solution else None
    if "problem" not in row:
        raise ConfigError(where, str(row)[:80], "rows need 'problem' and 'answer' or a 'solution' with \\boxed{}")
    return None if not answer else {"problem": row["problem"], "answer": answer, "solution": solution}


@TASKS.register("math500")
class Math500Task(TextTask):
    config_class = Math500Config
    cfg: Math500Config
    metric_help = {"accuracy": "share of items whose final answer (the last \\boxed{} of a chat answer) math-verify finds equal to the gold answer"}
    template_fields = ("problem",)

    def load_test(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        rows = load_rows(cfg.data_path, "task.data_path", ("problem", "answer"), cfg.hub_id, cfg.hub_config, "test")
        items = [_item(r, "task.data_path") for r in rows]
        return [it for it in items if it is not None][: cfg.num_test]

    def load_train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        if cfg.train_data_path:
            rows = load_jsonl(cfg.train_data_path, "task.train_data_path", ("problem",))
        else:
            rows = []
            for subject in cfg.train_hub_configs:
                rows += list(load_hub(cfg.train_hub_id, subject, "train", "task.train_hub_id"))
        held_out = {it["problem"] for it in self._test}
        parsed = [_item(r, "task.train_data_path") for r in rows]
        items = [it for it in parsed if it is not None and it["problem"] not in held_out]
        return seeded_subset(items, cfg.num_train, f"math500/train/{cfg.seed}")

    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        return {"problem": item["problem"]}

    def gold(self, item: dict[str, Any]) -> str:
        return item["answer"]

    def answer(self, item: dict[str, Any]) -> str:
        return item["answer"] if self.compact else f"\\boxed{{{item['answer']}}}"

    def reasoning(self, item: dict[str, Any]) -> str:
        return (item.get("solution") or "").strip() or "See the answer."

    def parse(self, completion: str) -> str:
        return math_rewards.math_prediction(completion)

    def reward_catalogue(self) -> dict[str, RewardFn]:
        correct = functools.partial(math_rewards.math_correctness_reward, timeout_s=self.cfg.verify_timeout_s,
                                    workers=self.cfg.verify_workers)
        return {**format_catalogue(), "format": math_rewards.math_format_reward, "correct": correct,
                "d1_format": d1_rewards.d1_math_format_reward, "d1_correct": d1_rewards.d1_math_correctness_reward}

    def reward_presets(self) -> dict[str, dict[str, float]]:
        return {"d1": {"d1_correct": 1.0, "d1_format": 1.0}, "d1_fixed": {"format": 1.0, "correct": 1.0},
                "plain": {"correct": 1.0}}
