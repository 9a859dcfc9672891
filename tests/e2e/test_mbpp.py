"""A short RL run on MBPP (``experiment=mbpp_cpu`` made smaller): rollouts and evaluations scored in the
sandbox, each distinct program run once, each reference solution timed once. The task itself:
tests/unit/tasks/test_mbpp.py."""

from __future__ import annotations

import csv
import json

from tests.helpers.common import compose_cfg
from tests.unit.tasks.test_mbpp import mbpp_row
from tests.unit.tasks.test_text_tasks import write_jsonl


def test_a_short_rl_run_scores_its_rollouts_in_the_sandbox(tmp_path, monkeypatch):
    from diffusion_rl.app.train import train
    from diffusion_rl.sandbox.limits import MEASURE_CPU_S
    from diffusion_rl.sandbox.runner import Sandbox

    rows = [{**mbpp_row(i), "text": f"Return {i}.", "code": f"def f():\r\n    return {i}",
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
