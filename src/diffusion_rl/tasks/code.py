"""What the code benchmarks (HumanEval, MBPP) share: prompts, targets, sandboxed rewards, pass@1.

Prompts (``task.prompt_style``):

* ``chat`` (instruction-tuned LMs): EvalPlus's instruct prompt, the form the code-RL papers evaluate
  with: one user turn "Please provide a self-contained Python script that solves the following
  problem in a markdown code block:" followed by the problem in a code block (HumanEval: the
  signature and docstring; MBPP: the task text and its first test in a docstring), and the response
  opened with ``task.eval_prefill`` ("Below is a Python script ... ```python"), so the model writes
  the code and closes the block. Training uses the same prompt as evaluation (``task.prompt`` =
  ``task.eval_prompt``): the rollouts are the code the reward runs. The target (warm start,
  ``policy=reference``) is the canonical solution followed by the closing fence.
* ``compact`` (the embedded character model): a one-line prompt (HumanEval: the signature; MBPP:
  the first test) and the bare code as the completion (HumanEval: the body, run after the prompt).

Rewards (``task.rewards``): ``correct`` (1.0 when every test passes: the default, and pass@1 as the
metric), ``tests`` (the fraction of tests passed). Programs run in the sandbox configured by
``task.sandbox`` (``sandbox/runner.py``); each completion's verdict (``passed``, ``reason``,
``detail``, tests passed, seconds, captured output) goes to the generations files as ``sandbox``.

Items carry the fields ``rewards/code.py`` reads: ``tests``, ``remote_names``, ``prompt_code``,
``setup``, ``trusted_setup`` and ``reference`` (the reference solution as a completion: its CPU time,
measured once per machine, sets the item's CPU limit, ``sandbox/limits.py``). A program over its
limit scores 0 with the verdict ``timeout``; rollouts log the share as ``reward/timeout_frac``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from diffusion_rl.rewards import code as code_rewards  # module objects: see tasks/text.py
from diffusion_rl.sandbox.runner import REASONS, SandboxConfig
from diffusion_rl.tasks.base import RewardFn, TaskConfig
from diffusion_rl.tasks.text import TextTask, TextTaskConfig

EVALPLUS_INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a "
                        "markdown code block:")
EVALPLUS_RESPONSE = ("Below is a Python script with a self-contained function that solves the problem and passes "
                     "corresponding tests:\n```python\n")


@dataclass
class CodeTaskConfig(TextTaskConfig):
    eval_batch_size: int = 64  # chat prompts of up to 512 generated tokens
    chat_train_system: str = ""  # unused: code tasks train on the evaluation prompt
    chat_eval_system: str = ""  # EvalPlus's prompt has no system text
    eval_prefill: str = EVALPLUS_RESPONSE  # opens the response's code block
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def validate(self) -> None:
        super().validate()
        self.sandbox.validate()


class CodeTask(TextTask):
    """Base of HumanEval and MBPP; subclasses load items with the fields of ``rewards/code.py``."""

    config_class: type[TaskConfig] = CodeTaskConfig
    cfg: CodeTaskConfig
    correct_reward = code_rewards.CORRECT_REWARD
    metric_help = {
        "pass@1": "share of problems whose greedy program passes every test in the sandbox",
        "tests_passed": "share of each problem's tests the program passes, averaged over problems",
        **{f"frac/{r}": f"share of programs whose sandbox verdict is {r}" for r in REASONS},
    }

    def __init__(self, cfg: CodeTaskConfig):
        self.code_reward = code_rewards.CodeReward(cfg.sandbox)  # before the base resolves the rewards
        super().__init__(cfg)

    @abstractmethod
    def solution(self, item: dict[str, Any]) -> str:
        """The canonical solution as the prompt style expects it (a script, or a compact completion)."""

    # ---- prompts and targets ------------------------------------------------------------------
    def prompt(self, item: dict[str, Any]) -> str:
        # chat: train on the evaluation prompt, so the rollouts are code in the form the reward reads
        return super().prompt(item) if self.compact else self.eval_prompt(item)

    def answer(self, item: dict[str, Any]) -> str:
        return self.solution(item)

    def reasoning(self, item: dict[str, Any]) -> str:
        return ""

    def target(self, item: dict[str, Any]) -> str:
        if self.compact:
            return self.solution(item)
        return f"{self.cfg.eval_prefill}{self.solution(item).rstrip()}\n```\n"

    def parse(self, completion: str) -> str:
        return code_rewards.extract_code(completion)

    # ---- rewards and metrics ------------------------------------------------------------------
    def as_scored(self, fn: RewardFn) -> RewardFn:
        return fn  # a compact completion is code already, never wrapped in <answer> tags

    def reward_catalogue(self) -> dict[str, RewardFn]:
        return {"correct": self.code_reward.correct, "tests": self.code_reward.tests_passed}

    def reward_presets(self) -> dict[str, dict[str, float]]:
        return {"d1": {"correct": 1.0}, "plain": {"correct": 1.0}}

    def details(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"sandbox": r.as_dict()} for r in self.code_reward.results(completions, items)]

    def reward_metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        """``reward/timeout_frac``: the share of programs stopped by their CPU or wall-clock limit (reward 0,
        as a wrong program; a rise says the limits, or the machine's load, cost correct programs)."""
        results = self.code_reward.results(completions, items)  # the verdicts the rewards just used (cached)
        return {"reward/timeout_frac": sum(r.reason == "timeout" for r in results) / max(len(results), 1)}

    def metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        """``pass@1`` (greedy: the share of programs passing every test), the mean ``reward``, the mean
        share of ``tests_passed``, and the share of each sandbox ``reason`` (``frac/timeout``, ...)."""
        results = self.code_reward.results(completions, items)
        n = max(len(results), 1)
        out = {
            "pass@1": sum(r.passed for r in results) / n,
            "reward": float(self.rewards(completions, items).sum()) / n,
            "tests_passed": sum(r.tests_passed / max(r.tests_total, 1) for r in results) / n,
        }
        return out | {f"frac/{reason}": sum(r.reason == reason for r in results) / n for reason in REASONS}
