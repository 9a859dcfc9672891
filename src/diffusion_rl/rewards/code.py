"""Code rewards (HumanEval, MBPP): extract the program from a completion, run it against the item's
tests in the sandbox (``sandbox.py``), and score it.

* ``correct`` (:meth:`CodeReward.correct`): 1.0 when the program passes every test, else 0.0 (pass@1
  is its mean over greedy completions).
* ``tests`` (:meth:`CodeReward.tests_passed`): the fraction of the item's tests passed (partial
  credit; MBPP has 3 tests, HumanEval one ``check``).

The program is the first fenced code block of the completion (```` ```python ````, ```` ```py ```` or
a bare ```` ``` ````; an unclosed fence runs to the end); when the text before the first fence is
Python, that text (the prompt ended by opening the block, as the chat prompts do); without a fence,
the whole completion.
With a ``prompt_code`` (HumanEval's prompt: signature and docstring, sometimes helpers the tests
use), a completion that defines the entry point itself is run after the prompt (so the prompt's
imports and helpers exist) and one that does not is taken as the function's body and appended to
the prompt, as the original HumanEval completions are.

Item fields (the code tasks' items carry them): ``tests`` (statements the harness runs),
``remote_names`` (names the tests call that the program must define: the entry point),
``prompt_code``, ``setup`` (runs after the program, in its process: MBPP's ``test_setup_code``) and
``trusted_setup`` (runs in the harness before the tests) and ``reference`` (the item's reference
solution, as a completion). A program's CPU limit is its item's (``sandbox/limits.py``):
``max(cpu_floor_s, cpu_factor x`` the reference's measured CPU time``)``, measured the first time the
item is scored on this machine; an item without ``reference`` gets ``cpu_floor_s``. A program over its
limit scores 0 like a wrong one, with the verdict ``timeout`` (not ``failed``). Results are cached by
program and tests (an LRU of 4096), so the composite reward, the metrics and the generations file
run each program once.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from diffusion_rl.rewards.answer import column, completion_text
from diffusion_rl.sandbox.limits import ReferenceTimes
from diffusion_rl.sandbox.runner import Program, Sandbox, SandboxConfig, SandboxResult

CORRECT_REWARD = 1.0
CACHE_SIZE = 4096
ITEM_FIELDS = ("tests", "remote_names", "prompt_code", "setup", "trusted_setup", "reference", "task_id")
_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n")


def extract_code(text: str) -> str:
    """The code of a completion: the text before its first fence when that text is Python (the prompt
    opened the block), else the first fenced block (to the end if unclosed), else all of the text."""
    if not isinstance(text, str):
        return ""
    first = text.find("```")
    if first < 0:
        return text
    if text[:first].strip() and _compiles(text[:first]):
        return text[:first]
    m = _FENCE_RE.search(text)
    start = m.end() if m is not None else first + 3
    end = text.find("```", start)
    return text[start:] if end < 0 else text[start:end]


def _compiles(code: str) -> bool:
    try:
        compile(code, "<completion>", "exec")
        return True
    except Exception:  # noqa: BLE001 - SyntaxError, but also RecursionError / MemoryError on hostile text
        return False


def assemble(code: str, prompt_code: str | None, entry_point: str | None) -> str:
    """The program to run: ``code`` alone, or after the prompt (see the module docstring)."""
    if not prompt_code:
        return code
    if entry_point and re.search(rf"^[ \t]*def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.MULTILINE):
        return f"{prompt_code}\n{code}"
    return prompt_code + code


def program_of(completion: Any, item: dict[str, Any]) -> Program:
    """The :class:`Program` a completion makes for an item (fields of the module docstring)."""
    remote = tuple(item.get("remote_names") or ())
    code = assemble(extract_code(completion_text(completion)), item.get("prompt_code"), remote[0] if remote else None)
    return Program(code, tuple(item.get("tests") or ()), item.get("setup") or "", item.get("trusted_setup") or "",
                   remote)


class CodeReward:
    """Runs completions in a :class:`Sandbox` and scores them; TRL-style reward methods."""

    def __init__(self, cfg: SandboxConfig | None = None):
        self.sandbox = Sandbox(cfg)
        self.references = ReferenceTimes(self.sandbox, self.sandbox.cfg.cache_dir)
        self._cache: OrderedDict[str, SandboxResult] = OrderedDict()

    def results(self, completions: Sequence[Any], items: Sequence[dict[str, Any]]) -> list[SandboxResult]:
        """One :class:`SandboxResult` per completion (cached; the uncached ones run in parallel)."""
        programs = self._with_limits([program_of(c, it) for c, it in zip(completions, items)], items)
        keys = [p.digest() for p in programs]
        todo = {k: p for k, p in zip(keys, programs) if k not in self._cache and p.tests}
        if todo:
            for k, res in zip(todo, self.sandbox.run(list(todo.values()))):
                self._cache[k] = res
        out = []
        for k, p in zip(keys, programs):
            if not p.tests:
                out.append(SandboxResult(False, "sandbox_error", "the item has no tests"))
                continue
            self._cache.move_to_end(k)
            out.append(self._cache[k])
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return out

    def _with_limits(self, programs: list[Program], items: Sequence[dict[str, Any]]) -> list[Program]:
        """Each program with its item's CPU limit, from the item's reference solution."""
        cfg = self.sandbox.cfg
        timed = [i for i, it in enumerate(items) if it.get("reference") and programs[i].tests]
        if cfg.cpu_factor == 0 or not timed:
            return programs  # every program gets the floor
        refs = [program_of(items[i]["reference"], items[i]) for i in timed]
        seconds = self.references.seconds(refs, [f"task {items[i].get('task_id', '?')}" for i in timed])
        out = list(programs)
        for i, t in zip(timed, seconds):
            out[i] = replace(programs[i], cpu_s=cfg.cpu_limit(t))
        return out

    def _score(self, completions: Sequence[Any], fields: dict[str, Any], partial: bool) -> list[float]:
        comps = list(completions) if isinstance(completions, Sequence) and not isinstance(completions, str) else []
        n = len(comps)
        cols = {k: column(fields.get(k), n) for k in ITEM_FIELDS}
        items = [{k: cols[k][i] for k in ITEM_FIELDS} for i in range(n)]
        res = self.results(comps, items)
        if partial:
            return [r.tests_passed / r.tests_total if r.tests_total else 0.0 for r in res]
        return [CORRECT_REWARD if r.passed else 0.0 for r in res]

    def correct(self, prompts: list[str], completions: list[str], **fields: Any) -> list[float]:
        """1.0 when the program passes every test of its item, else 0.0."""
        return self._score(completions, fields, partial=False)

    def tests_passed(self, prompts: list[str], completions: list[str], **fields: Any) -> list[float]:
        """The fraction of its item's tests the program passes."""
        return self._score(completions, fields, partial=True)

    def close(self) -> None:
        self.sandbox.close()

