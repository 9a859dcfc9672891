"""Code rewards (``rewards/code.py``) and what the code tasks share (``tasks/code.py``): the program a
completion makes, scores, one sandbox run per distinct program, the verdict in the generations.

Run: pytest tests/unit/rewards/test_code.py -q
"""

from __future__ import annotations

import pytest

from diffusion_rl.rewards.code import CodeReward, assemble, extract_code, program_of
from diffusion_rl.sandbox.runner import SandboxConfig

PROMPT = 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs."""\n'
ITEM = {"tests": ["def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\ncheck(add)\n"],
        "remote_names": ["add"], "prompt_code": PROMPT, "trusted_setup": PROMPT, "setup": ""}
MBPP_ITEM = {"tests": ["assert twice(2) == 4", "assert twice(0) == 0", "assert twice(-1) == -2"],
             "remote_names": ["twice"], "prompt_code": "", "trusted_setup": "", "setup": ""}


@pytest.mark.parametrize("text,code", [
    ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n"),
    ("```py\nx = 1\n```", "x = 1\n"),
    ("```\nx = 1\n```\n```python\ny = 2\n```", "x = 1\n"),  # the first block
    ("```python\ndef f():\n    return 1\n", "def f():\n    return 1\n"),  # unclosed: to the end
    ("def f():\n    return 1\n```\nThis function...", "def f():\n    return 1\n"),  # the prompt opened it
    ("x = 1", "x = 1"),
    (None, ""),
])
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_a_body_completes_the_prompt_and_a_whole_function_follows_it():
    body = "    return sum(xs)\n"
    assert assemble(body, PROMPT, "add") == PROMPT + body
    full = "def add(xs):\n    return sum(xs)\n"
    assert assemble(full, PROMPT, "add") == PROMPT + "\n" + full  # the prompt's imports and helpers stay
    assert assemble(full, "", "add") == full


def test_program_of_a_chat_completion():
    prog = program_of("Sure.\n```python\ndef add(xs):\n    return sum(xs)\n```", ITEM)
    assert prog.code.endswith("def add(xs):\n    return sum(xs)\n") and prog.remote_names == ("add",)
    assert prog.tests == tuple(ITEM["tests"]) and prog.trusted_setup == PROMPT


@pytest.fixture(scope="module")
def reward():
    r = CodeReward(SandboxConfig(workers=2, memory_mb=256, max_processes=8))
    yield r
    r.close()


def test_scores_and_partial_credit(reward):
    comps = ["```python\ndef twice(x):\n    return 2 * x\n```", "```python\ndef twice(x):\n    return x + 2\n```",
             "```python\ndef twice(x) return\n```"]
    fields = {k: [MBPP_ITEM[k]] * 3 for k in MBPP_ITEM}
    assert reward.correct([""] * 3, comps, **fields) == [1.0, 0.0, 0.0]
    assert reward.tests_passed([""] * 3, comps, **fields) == pytest.approx([1.0, 1 / 3, 0.0])  # 2+2 == 2*2


def test_each_distinct_program_runs_once(reward, monkeypatch):
    runs = []
    real = reward.sandbox.run
    monkeypatch.setattr(reward.sandbox, "run", lambda programs: runs.append(len(programs)) or real(programs))
    comp = "```python\ndef add(xs):\n    return sum(xs) + 0\n```"
    items = [ITEM] * 4
    first = reward.results([comp, comp, "    return 0\n", comp], items)
    again = reward.results([comp], [ITEM])
    assert runs == [2]  # two distinct programs, then the cache
    assert [r.passed for r in first] == [True, True, False, True] and again[0] is first[0]


def test_an_item_without_tests_never_passes(reward):
    (res,) = reward.results(["x = 1"], [{**MBPP_ITEM, "tests": []}])
    assert not res.passed and res.reason == "sandbox_error"
