"""MBPP: 974 short Python problems, each with a text, a reference solution and three ``assert`` tests.

Data: the original MBPP release, a JSONL of ``task_id``, ``text``, ``code``, ``test_list``,
``test_setup_code``, ``challenge_test_list`` (``task.data_path``, e.g. ``tests/fixtures/mbpp/mbpp.jsonl``,
holding all problems or any subset), or the hub's ``google-research-datasets/mbpp`` (config
``full``) by name. The usual split by ``task_id`` (the MBPP paper's): prompt 1-10 (few-shot
examples), test 11-510, validation 511-600, train 601-974. Evaluation uses ``task.eval_split``
(``test``, 500 problems, or ``validation``); RL trains on ``train`` (``task.train_data_path``: a
separate file, else the same one).

Tests: the three ``assert`` lines, run one by one in the sandbox's harness (``test_setup_code``, which
builds the program's own objects, runs in the program's process first); the names they call that
the reference solution defines (the entry point, sometimes a class) come from the program. Chat
prompt: EvalPlus's MBPP form, the text and the first test in a docstring; compact prompt: the first
test. Targets: the reference solution, whose measured CPU time sets the problem's CPU limit
(``sandbox/limits.py``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.base import TASKS
from diffusion_rl.tasks.code import EVALPLUS_INSTRUCTION, CodeTask, CodeTaskConfig
from diffusion_rl.tasks.loading import load_hub, load_jsonl, seeded_subset

COLUMNS = ("task_id", "text", "code", "test_list")
SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
EVAL_SPLITS = ("test", "validation")


@dataclass
class MBPPConfig(CodeTaskConfig):
    name: str = "mbpp"
    num_test: int = 500  # the test split, as the papers
    compact_template: str = "{test}\n"
    chat_user_template: str = EVALPLUS_INSTRUCTION + '\n```\n"""\n{text}\n{test}\n"""\n```\n'
    hub_id: str = "google-research-datasets/mbpp"
    hub_config: str | None = "full"
    eval_split: str = "test"  # test (task_id 11-510) | validation (511-600)

    def validate(self) -> None:
        super().validate()
        if self.eval_split not in EVAL_SPLITS:
            raise ConfigError("task.eval_split", self.eval_split, f"allowed: {', '.join(EVAL_SPLITS)}")


def remote_names(code: str, tests: list[str]) -> list[str]:
    """Names the tests call that the solution defines at top level, the first test's callee first."""
    defined = {n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    called: list[str] = []
    for test in tests:
        for node in ast.walk(ast.parse(test)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in called:
                called.append(node.func.id)
    return [name for name in called if name in defined]


def make_item(row: dict[str, Any], where: str) -> dict[str, Any]:
    code = str(row["code"]).replace("\r\n", "\n")
    tests = list(row["test_list"])
    try:
        names = remote_names(code, tests)
    except SyntaxError as err:
        raise ConfigError(where, row.get("task_id"), f"task {row.get('task_id')}: code or test does not parse ({err.msg})") from err
    return {
        "task_id": int(row["task_id"]), "text": row["text"], "code": code, "test_list": tests,
        "tests": tests, "remote_names": names, "setup": (row.get("test_setup_code") or "").replace("\r\n", "\n"),
        "prompt_code": "", "trusted_setup": "", "reference": code,
    }


@TASKS.register("mbpp")
class MBPPTask(CodeTask):
    config_class = MBPPConfig
    cfg: MBPPConfig
    template_fields = ("text", "test", "tests")

    def _split(self, split: str, path: str | None, key: str) -> list[dict[str, Any]]:
        if path:
            lo, hi = SPLITS[split]
            rows = [r for r in load_jsonl(path, key, COLUMNS) if lo <= int(r["task_id"]) <= hi]
            if not rows:
                raise ConfigError(key, path, f"holds no problem of the {split} split (task_id {lo}-{hi})")
        else:
            rows = list(load_hub(self.cfg.hub_id, self.cfg.hub_config, split, "task.hub_id"))
        return sorted((make_item(r, key) for r in rows), key=lambda it: it["task_id"])

    def load_test(self) -> list[dict[str, Any]]:
        return self._split(self.cfg.eval_split, self.cfg.data_path, "task.data_path")[: self.cfg.num_test]

    def load_train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        path, key = (cfg.train_data_path, "task.train_data_path") if cfg.train_data_path else (cfg.data_path, "task.data_path")
        held_out = {it["task_id"] for it in self._test}
        items = [it for it in self._split("train", path, key) if it["task_id"] not in held_out]
        return seeded_subset(items, cfg.num_train, f"mbpp/train/{cfg.seed}")

    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        return {"text": item["text"], "test": item["test_list"][0], "tests": "\n".join(item["test_list"])}

    def solution(self, item: dict[str, Any]) -> str:
        return item["code"]

    def gold(self, item: dict[str, Any]) -> str:
        return item["code"]
