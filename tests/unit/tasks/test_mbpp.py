"""MBPP: the usual split by task_id, prompts, the names the tests take from the program, and
``policy=reference`` scoring 100% on the test split (a wrong solution set scores 0).

The real file is tests/fixtures/mbpp/mbpp.jsonl (see tests/fixtures/README.md). Run: pytest tests/unit/tasks/test_mbpp.py -q
"""

from __future__ import annotations

import json

import pytest

from diffusion_rl.app.evaluate import evaluate_checkpoint, rescore_generations
from diffusion_rl.app.train import build_task
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.mbpp import remote_names
from tests.conftest import FIXTURES
from tests.helpers.common import compose_cfg
from tests.unit.tasks.test_text_tasks import compose_eval, write_jsonl

MBPP = FIXTURES / "mbpp" / "mbpp.jsonl"


def mbpp_row(task_id: int) -> dict:
    """An MBPP row (task ``task_id``) whose reference solution passes its three tests."""
    return {"task_id": task_id, "text": f"Write a function to double a number ({task_id}).",
            "code": "def double(x):\r\n    return 2 * x", "test_setup_code": "", "challenge_test_list": [],
            "test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"]}


def _task(tmp_path, *overrides):
    return build_task(compose_cfg(["task=mbpp", *overrides], tmp_path, tiny=False).task)


def test_split_by_task_id_and_prompts(tmp_path):
    path = write_jsonl(tmp_path / "mbpp.jsonl", [mbpp_row(i) for i in (5, 11, 510, 511, 600, 601, 974)])
    task = _task(tmp_path, f"task.data_path={path}")
    assert [it["task_id"] for it in task.test_items()] == [11, 510]
    assert [it["task_id"] for it in task.train_items()] == [601, 974]
    assert [it["task_id"] for it in _task(tmp_path, f"task.data_path={path}", "task.eval_split=validation").test_items()] == [511, 600]
    item = task.test_items()[0]
    assert item["code"] == "def double(x):\n    return 2 * x" and item["remote_names"] == ["double"]
    prompt = task.eval_prompt(item)
    assert '"""\nWrite a function to double a number (11).\nassert double(2) == 4\n"""' in prompt
    assert _task(tmp_path, f"task.data_path={path}", "task.prompt_style=compact").prompt(item) == "assert double(2) == 4\n"
    only_test = write_jsonl(tmp_path / "t.jsonl", [mbpp_row(12)])
    with pytest.raises(ConfigError, match="holds no problem of the train split"):
        _task(tmp_path, f"task.data_path={only_test}").train_items()
    with pytest.raises(ConfigError, match="task.eval_split"):
        _task(tmp_path, "task.eval_split=prompt")
    with pytest.raises(ConfigError, match="task.hub_id.*offline"):
        _task(tmp_path).test_items()  # no file and no network: one line saying what to do


def test_remote_names_are_what_the_tests_call_that_the_solution_defines():
    code = "class Pair:\n    pass\ndef longest(pairs, n):\n    return n\ndef helper():\n    pass\n"
    assert remote_names(code, ["assert longest([Pair(5, 24), Pair(1, 2)], 2) == 3"]) == ["longest", "Pair"]
    assert remote_names("def sum(a, b):\n    return 1\n", ["assert sum(10, 15) == 6"]) == ["sum"]  # shadows a builtin


def test_reference_passes_the_test_split_and_a_wrong_set_nothing(tmp_path):
    cfg = compose_eval(["task=mbpp", f"task.data_path={MBPP}", "policy=reference", "eval.gen_lengths=[128]"], tmp_path)
    summary = evaluate_checkpoint(cfg, tmp_path / "ref")
    assert summary["pass@1"] == 1.0 and summary["num_items"] == 500
    records = [json.loads(line) for line in open(tmp_path / "ref" / "generations.jsonl")]
    assert records[0]["item"]["task_id"] == 11 and all(r["sandbox"]["tests_passed"] == 3 for r in records)
    for r in records:
        r["completion"] = "".join(f"def {n}(*args):\n    return None\n" for n in r["item"]["remote_names"]) + "```\n"
    wrong = write_jsonl(tmp_path / "wrong.jsonl", records)
    out = rescore_generations(compose_eval(["task=mbpp", "mode=score", f"generations={wrong}"], tmp_path), tmp_path / "w")
    assert out["pass@1"] == 0.0


def test_every_split_of_the_real_file(tmp_path):
    task = _task(tmp_path, f"task.data_path={MBPP}")
    assert len(task.test_items()) == 500 and len(task.train_items()) == 374
    assert len(_task(tmp_path, f"task.data_path={MBPP}", "task.eval_split=validation").test_items()) == 90
