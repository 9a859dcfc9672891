"""GSM8K: grade-school word problems with a numeric answer (docs/methods.md §5).

Items are rows of ``openai/gsm8k`` (config ``main``): ``{"question", "answer"}`` where ``answer`` is
the worked solution ending ``#### <number>``. Data: the hub's ``train`` / ``test`` splits, or local
JSONL files in the same format (``task.train_data_path``, ``task.data_path``). Training items never
repeat a test question.

Rewards (``task.rewards``): ``d1`` = d1's own five functions, quirks included
(``rewards/d1/rewards.py``); ``d1_fixed`` (the default for chat prompts) = the same composite
corrected (``xml_count`` + ``soft_format`` + ``strict_format`` + ``int`` + ``correct``, at most 4.0;
``rewards/gsm8k.py`` lists the corrections); ``plain`` = ``correct`` (2.0 for the right number).
``task.strict_string=true`` makes ``correct`` compare the answer text with the gold string exactly
(``72.0`` is then wrong; not d1's rule, which ``d1`` has). The chat target writes the worked solution (calculator annotations ``<<...>>`` removed)
as reasoning and the bare number as the answer; the compact target is the number.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from diffusion_rl.rewards import gsm8k as gsm8k_rewards  # module object: see tasks/text.py
from diffusion_rl.rewards.d1 import rewards as d1_rewards
from diffusion_rl.tasks.base import TASKS, RewardFn
from diffusion_rl.tasks.loading import load_rows, seeded_subset
from diffusion_rl.tasks.text import TextTask, TextTaskConfig, format_catalogue

COLUMNS = ("question", "answer")
_CALC_RE = re.compile(r"<<[^>]*>>")


@dataclass
class GSM8KConfig(TextTaskConfig):
    name: str = "gsm8k"
    eval_batch_size: int = 64  # chat prompts of up to 512 generated tokens
    compact_template: str = "{question}\nA:"
    chat_user_template: str = "{question}"
    hub_id: str = "openai/gsm8k"
    hub_config: str | None = "main"
    strict_string: bool = False  # `correct` compares the answer text with the gold string exactly


def _items(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"question": r["question"], "answer": r["answer"]} for r in rows]


@TASKS.register("gsm8k")
class GSM8KTask(TextTask):
    config_class = GSM8KConfig
    cfg: GSM8KConfig
    metric_help = {"accuracy": "share of items whose final number equals the gold answer (after removing , $ and .0; "
                               "task.strict_string=true: as strings)"}
    template_fields = ("question",)

    def load_test(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        rows = load_rows(cfg.data_path, "task.data_path", COLUMNS, cfg.hub_id, cfg.hub_config, "test")
        return _items(rows)[: cfg.num_test]

    def load_train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        rows = load_rows(cfg.train_data_path, "task.train_data_path", COLUMNS, cfg.hub_id, cfg.hub_config, "train")
        held_out = {it["question"] for it in self._test}
        items = [it for it in _items(rows) if it["question"] not in held_out]
        return seeded_subset(items, cfg.num_train, f"gsm8k/train/{cfg.seed}")

    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        return {"question": item["question"]}

    def gold(self, item: dict[str, Any]) -> str:
        return gsm8k_rewards.gsm8k_gold(item["answer"])

    def answer(self, item: dict[str, Any]) -> str:
        return self.gold(item)

    def reasoning(self, item: dict[str, Any]) -> str:
        worked = item["answer"].rpartition("####")[0] or item["answer"]
        return _CALC_RE.sub("", worked).strip()

    def parse(self, completion: str) -> str:
        return gsm8k_rewards.extract_gsm8k_prediction(completion) or ""

    def reward_catalogue(self) -> dict[str, RewardFn]:
        correct = functools.partial(gsm8k_rewards.gsm8k_correctness_reward, strict_string=self.cfg.strict_string)
        return {**format_catalogue(), "int": gsm8k_rewards.int_reward, "correct": correct,
                "d1_xml_count": d1_rewards.d1_xml_count_reward, "d1_soft_format": d1_rewards.d1_soft_format_reward,
                "d1_strict_format": d1_rewards.d1_strict_format_reward, "d1_int": d1_rewards.d1_int_reward,
                "d1_correct": d1_rewards.d1_gsm8k_correctness_reward}

    def reward_presets(self) -> dict[str, dict[str, float]]:
        terms = ("xml_count", "soft_format", "strict_format", "int", "correct")
        return {
            "d1": {f"d1_{t}": 1.0 for t in terms},
            "d1_fixed": dict.fromkeys(terms, 1.0),
            "plain": {"correct": 1.0},
        }
