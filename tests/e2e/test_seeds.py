"""Two seeds: the RL seed (`seed`) and the warm start's (`warmstart.seed`). Runs that differ only in the
RL seed share the initial weights, the warm start and the test items (a paired comparison), and
differ in their rollouts; another warm-start seed is another starting point."""

import json

from diffusion_rl.app.train import train
from tests.helpers.common import compose_cfg

RUN = ["trainer.max_steps=2", "eval.every_n_steps=0", "trainer.checkpoint_every_n_steps=0",
       "diagnostics.samples_every_n_steps=0", "warmstart.reuse=true"]


def _run(tmp_path, name, *extra):
    summary = train(compose_cfg([*RUN, *extra], tmp_path), tmp_path / name)
    generations = [json.loads(line) for line in (tmp_path / name / "eval_generations.jsonl").read_text().splitlines()]
    return summary, generations


def test_rl_seeds_share_the_warm_start_and_the_test_items(tmp_path):
    a, gen_a = _run(tmp_path, "a", "seed=0")
    b, gen_b = _run(tmp_path, "b", "seed=1")
    assert a["warm_start"]["key"] == b["warm_start"]["key"] and b["warm_start"]["reused"]  # one warm start, reused
    assert a["before"] == b["before"]  # the same starting policy on the same test items
    assert [g["puzzle"] for g in gen_a] == [g["puzzle"] for g in gen_b]
    assert a["grad"] != b["grad"]  # the RL runs themselves differ


def test_the_warm_start_seed_gives_another_starting_point(tmp_path):
    a, _ = _run(tmp_path, "a", "seed=0")
    c, _ = _run(tmp_path, "c", "seed=0", "warmstart.seed=1")
    assert a["warm_start"]["key"] != c["warm_start"]["key"] and not c["warm_start"]["reused"]
    assert a["before"] != c["before"]
