"""MBPP: the usual split by task_id, prompts, the names the tests take from the program, and
``policy=reference`` scoring 100% on the test split (a wrong solution set scores 0).

The real file is tests/fixtures/mbpp/mbpp.jsonl (see tests/fixtures/README.md). Run: pytest tests/unit/tasks/test_mbpp.py -q
"""

from __future__ import annotations

import csv
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


def _row(task_id: int) -> dict:
    return {"task_id": task_id, "text": f"Write a function to double a number ({task_id}).",
            "code": "def double(x):\r\n    return 2 * x", "test_setup_code": "", "challenge_test_list": [],
            "test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"]}


def _task(tmp_path, *overrides):
    return build_task(compose_cfg(["task=mbpp", *overrides], tmp_path, tiny=False).task)


def test_split_by_task_id_and_prompts(tmp_path):
    path = write_jsonl(tmp_path / "mbpp.jsonl", [_row(i) for i in (5, 11, 510, 511, 600, 601, 974)])
    task = _task(tmp_path, f"task.data_path={path}")
    assert [it["task_id"] for it in task.test_items()] == [11, 510]
    assert [it["task_id"] for it in task.train_items()] == [601, 974]
    assert [it["task_id"] for it in _task(tmp_path, f"task.data_path={path}", "task.eval_split=validation").test_items()] == [511, 600]
    item = task.test_items()[0]
    assert item["code"] == "def double(x):\n    return 2 * x" and item["remote_names"] == ["double"]
    prompt = task.eval_prompt(item)
    assert '"""\nWrite a function to double a number (11).\nassert double(2) == 4\n"""' in prompt
    assert _task(tmp_path, f"task.data_path={path}", "task.prompt_style=compact").prompt(item) == "assert double(2) == 4\n"
    only_test = write_jsonl(tmp_path / "t.jsonl", [_row(12)])
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


def test_a_short_rl_run_scores_its_rollouts_in_the_sandbox(tmp_path, monkeypatch):
    from diffusion_rl.app.train import train
    from diffusion_rl.sandbox.limits import MEASURE_CPU_S
    from diffusion_rl.sandbox.runner import Sandbox

    rows = [{**_row(i), "text": f"Return {i}.", "code": f"def f():\r\n    return {i}",
             "test_list": [f"assert f() == {i}"] * 3} for i in [*range(11, 17), *range(601, 611)]]
    path = write_jsonl(tmp_path / "mbpp.jsonl", rows)
    ran, timed = [], []
    real = Sandbox.run

    def run(self, programs):
        if all(p.cpu_s == MEASURE_CPU_S for p in programs):  # reference solutions being timed (sandbox/limits.py)
            timed.extend(p.digest() for p in programs)
        else:
            ran.append(len(programs))
        return real(self, programs)

    monkeypatch.setattr(Sandbox, "run", run)
    cfg = compose_cfg(["experiment=mbpp_cpu", f"task.data_path={path}", "task.num_test=4", "task.prompts_per_batch=2",
                       "task.group_size=4", "sampler.gen_length=32", "sampler.block_length=32", "sampler.steps=8",
                       "trainer.max_steps=2", "warmstart.steps=3", "warmstart.batch_size=8"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    assert summary["optimizer_steps"] == 2 and {"pass@1", "frac/error"} <= set(summary["before"])
    # an evaluation (4 programs), two rollouts (8 each), an evaluation: each distinct program runs once
    assert len(ran) >= 3 and max(ran) <= 8 and sum(ran) <= 2 * 8 + 2 * 4
    # each scored item's reference is timed once (these take milliseconds: one run each), never again
    assert 4 <= len(timed) == len(set(timed)) <= len(rows)
    records = [json.loads(line) for line in open(tmp_path / "run" / "eval_generations.jsonl")]
    assert len(records) == 4 and all(r["sandbox"]["reason"] in ("passed", "failed", "error", "exited") for r in records)
    steps = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("train/reward")]
    assert [float(r["reward/timeout_frac"]) for r in steps] == [0.0, 0.0]  # logged each step with the rollout's metrics
