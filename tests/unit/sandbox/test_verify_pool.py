"""The math-verify pool: golds grouped so each is parsed once per worker, a deadline per step, a
worker that stops answering killed and replaced, verdicts cached. Speed and the choice of the
default timeout are measured by ``benchmarks/rewards.py``, not asserted here.

Run: pytest tests/unit/sandbox/test_verify_pool.py -q
"""

from __future__ import annotations

import importlib.util
import os
import signal

import pytest

from diffusion_rl.rewards import verify_pool
from diffusion_rl.rewards.math500 import math_correctness_reward
from diffusion_rl.rewards.verify_pool import VerifyPool

pytestmark = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="math-verify not installed")
HALF = "\\frac12"


@pytest.fixture(scope="module")
def pool():
    p = VerifyPool(1)
    assert p.verify([("0.5", HALF)]) == [True]  # started and warm
    yield p
    p.close()


def test_each_gold_goes_to_a_worker_once_with_its_distinct_predictions(pool, monkeypatch):
    sent = []
    real = pool._run

    def spy(units, out, timeout_s):
        sent.extend((u.gold, list(u.preds), [list(i) for i in u.index]) for u in units)
        return real(units, out, timeout_s)

    monkeypatch.setattr(pool, "_run", spy)
    pairs = [("1/2", HALF), ("0.50", HALF), ("1/2", HALF), ("2", "\\sqrt{4}"), ("3", HALF)]
    assert pool.verify(pairs) == [True, True, True, True, False]
    assert sent == [(HALF, ["1/2", "0.50", "3"], [[0, 2], [1], [4]]), ("\\sqrt{4}", ["2"], [[3]])]
    sent.clear()
    assert pool.verify(pairs[:2]) == [True, True]
    assert sent == []  # cached verdicts: nothing sent again


def test_a_pathological_prediction_is_wrong_after_its_deadline_and_the_rest_still_count(pool):
    pairs = [("(10^{8})!", "3"), ("0.5", HALF), ("9^{9^{9}}", "3"), ("\\frac{2}{4}", HALF)]
    assert pool.verify(pairs, timeout_s=0.3) == [False, True, False, True]
    assert pool.verify([("0.25", "\\frac14")]) == [True]  # the worker survived the deadlines


def test_a_worker_that_stops_answering_is_killed_and_replaced(monkeypatch):
    monkeypatch.setattr(verify_pool, "KILL_GRACE_S", 0.5)
    p = VerifyPool(1)
    try:
        assert p.verify([("0.5", HALF)]) == [True]
        os.kill(p._workers[0].proc.pid, signal.SIGSTOP)  # as if stuck in C code that ignores signals
        pairs = [("1/3", "\\frac13"), ("0.75", "\\frac34"), ("2", "\\sqrt{4}")]
        assert p.verify(pairs, timeout_s=0.5) == [False, True, True]  # its step is lost, not the others
        assert p.kills == 1 and len(p._workers) == 1 and p._workers[0].proc.poll() is None
    finally:
        p.close()


def test_the_reward_uses_the_pool_and_its_timeout(monkeypatch):
    seen = {}
    real = verify_pool.get_pool

    def spy(workers=0):
        pool = real(workers)
        verify = pool.verify

        def recording(pairs, timeout_s=verify_pool.DEFAULT_TIMEOUT_S):
            seen.update(pairs=list(pairs), timeout_s=timeout_s)
            return verify(pairs, timeout_s)

        monkeypatch.setattr(pool, "verify", recording)
        return pool

    monkeypatch.setattr(verify_pool, "get_pool", spy)
    gold = "\\frac{1}{2}"
    comps = ["<answer>\\boxed{\\dfrac{1}{2}}</answer>", "<answer>\\boxed{0.5}</answer>", "<answer>\\boxed{x}</answer>"]
    assert math_correctness_reward([""] * 3, comps, answer=[gold] * 3, timeout_s=3.0) == [2.0, 2.0, 0.0]
    # the first equals the gold as a normalised string: only the others needed parsing
    assert seen == {"pairs": [("0.5", gold), ("x", gold)], "timeout_s": 3.0}
