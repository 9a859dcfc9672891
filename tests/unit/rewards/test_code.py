"""Code rewards (``rewards/code.py``) and what the code tasks share (``tasks/code.py``): the program a
completion makes, scores, one sandbox run per distinct program, the verdict in the generations.

Run: pytest tests/unit/rewards/test_code.py -q
"""

from __future__ import annotations

import pytest

from diffusion_rl.rewards import code as code_rewards
from diffusion_rl.rewards.code import CodeReward, assemble, extract_code, program_of
from diffusion_rl.sandbox.runner import Program, SandboxConfig, SandboxResult

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


# ---- the program a completion makes, field by field ----------------------------------------------
def test_extract_code_edges():
    assert extract_code("x = 1\n```\nprint(x)\n```") == "x = 1\n"  # Python before the first fence wins
    assert extract_code("see: ```x = 1``` ok") == "x = 1"  # a fence without a newline: right after it


def test_the_entry_point_is_found_on_any_line():
    code = "import math\n\n\ndef add(xs):\n    return sum(xs)\n"
    assert assemble(code, PROMPT, "add") == PROMPT + "\n" + code
    assert assemble("    return 0\n", PROMPT, None) == PROMPT + "    return 0\n"  # no entry point: a body


def test_program_of_carries_every_field():
    item = {"tests": ["t1", "t2"], "remote_names": ["add", "helper"], "prompt_code": PROMPT, "setup": "S = 1",
            "trusted_setup": "T = 2"}
    full = "def add(xs):\n    return sum(xs)\n"
    assert program_of(f"```python\n{full}```", item) == Program(PROMPT + "\n" + full, ("t1", "t2"), "S = 1", "T = 2",
                                                               ("add", "helper"))
    assert program_of("x = 1", {"tests": ["t"]}) == Program("x = 1", ("t",), "", "", ())  # fields left out


# ---- CodeReward on a stand-in sandbox ---------------------------------------------------------------
REF_CPU_S = 3.0  # the stand-in's CPU time of a reference solution


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A CodeReward whose sandbox runs nothing: a program passes each test whose text it holds; a
    reference solution (code holding "REF") takes REF_CPU_S CPU seconds. Records every batch run."""
    r = CodeReward(SandboxConfig(workers=1, cpu_floor_s=5, cpu_factor=4.0, cache_dir=str(tmp_path)))
    r.batches = []

    def run(programs):
        r.batches.append(list(programs))
        out = []
        for p in programs:
            n = sum(t in p.code for t in p.tests)
            out.append(SandboxResult(n == len(p.tests), "passed" if n == len(p.tests) else "failed", "", n,
                                     len(p.tests), cpu_s=REF_CPU_S if "REF" in p.code else 0.01))
        return out

    monkeypatch.setattr(r.sandbox, "run", run)
    yield r
    r.close()


def test_items_without_tests_are_not_run(fake):
    items = [{"tests": []}, {"tests": ["a"]}]
    first, second = fake.results(["x = 1", "a"], items)
    assert first.passed is False and first.reason == "sandbox_error" and first.detail  # says why
    assert second.passed is True
    assert [[p.code for p in b] for b in fake.batches] == [["a"]]
    assert fake.tests_passed([""] * 2, ["a", "a"], tests=[[], ["a", "b"]]) == [0.0, 0.5]  # no tests: 0, not 0/0
    assert fake.correct([""] * 2, ["a", "a b"], tests=[[], ["a", "b"]]) == [0.0, 1.0]


def test_completions_that_are_not_a_list_score_nothing(fake):
    assert fake.correct([], "a", tests=["a"]) == [] and fake.tests_passed([], None, tests=[["a"]]) == []


def test_results_are_kept_least_recently_used_first_out(fake, monkeypatch):
    monkeypatch.setattr(code_rewards, "CACHE_SIZE", 2)
    item = {"tests": ["t"]}

    def ran(*codes):
        fake.batches.clear()
        fake.results(list(codes), [item] * len(codes))
        return [p.code for b in fake.batches for p in b]

    assert ran("A") == ["A"] and ran("B") == ["B"] and ran("A") == []  # A used again: now the most recent
    assert ran("C") == ["C"]  # three programs: B, the least recently used, goes
    assert ran("A") == [] and ran("C") == []
    assert ran("B") == ["B"]


def test_cpu_limits_follow_the_reference_solution(fake, tmp_path, monkeypatch):
    labels = []
    real = fake.references.seconds
    monkeypatch.setattr(fake.references, "seconds", lambda refs, names=None: labels.append(names) or real(refs, names))
    items = [{"tests": ["t"], "reference": "REF = 't'", "task_id": "Mbpp/2"}, {"tests": ["t"]},
             {"tests": ["t"], "reference": "REF = 't' or 1"}]
    fake.results(["t = 1", "t = 2", "t = 3"], items)
    # max(cpu_floor_s, ceil(cpu_factor x the reference's CPU time)) = max(5, 12) for the items with one
    assert [p.cpu_s for p in fake.batches[-1]] == [12, None, 12]
    measured = [p.code for b in fake.batches[:-1] for p in b]
    assert "REF = 't'" in measured and "REF = 't' or 1" in measured and "t = 2" not in measured
    assert labels == [["task Mbpp/2", "task ?"]]  # the log line names each reference's item
    assert list((tmp_path / "sandbox_limits").glob("*.json"))  # kept for the next run on this machine


def test_cpu_factor_zero_measures_no_reference(tmp_path, monkeypatch):
    r = CodeReward(SandboxConfig(workers=1, cpu_factor=0.0, cache_dir=str(tmp_path)))
    runs = []
    monkeypatch.setattr(r.sandbox, "run", lambda programs: runs.append(list(programs)) or
                        [SandboxResult(True, "passed", "", 1, 1) for _ in programs])
    r.results(["t = 1"], [{"tests": ["t"], "reference": "REF"}])
    assert [[p.cpu_s for p in b] for b in runs] == [[None]]  # one run, the program's, at the floor
    r.close()


def test_the_sandbox_runs_with_the_given_config():
    cfg = SandboxConfig(workers=1, memory_mb=128)
    r = CodeReward(cfg)
    assert r.sandbox.cfg is cfg and r.references.sandbox is r.sandbox
    r.close()
