"""What the text benchmarks (Countdown, GSM8K, MATH500) share: prompt styles and rewards from config.

Two prompt styles, chosen by ``task.prompt_style``:

* ``compact`` — for the character-level embedded model: a short template (Countdown
  ``"30,100,93->23:"``) and a bare answer as the target (``"30+93-100"``). Training and evaluation
  use the same template. A compact completion *is* the answer: the rewards score it as
  ``<answer>{completion}</answer>``.
* ``chat`` — for instruction-tuned diffusion LMs, as in d1: one user turn holding a system text, a
  blank line and the task's user template, rendered with the tokenizer's chat template
  (``add_generation_prompt=True``; without a chat template the turn is the text plus a newline).
  Training and evaluation differ as in d1: training uses ``chat_train_system`` (the
  ``<reasoning>/<answer>`` format prompt of diffu-grpo), evaluation ``chat_eval_system`` (the
  task's evaluation prompt) and ends the prompt with ``eval_prefill`` (``<reasoning>``), which
  then counts as the start of the response when it is scored. Targets are
  ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>\\n``.

Templates are ``str.format`` strings over the fields each task names in ``template_fields``
(literal braces doubled); an unknown field fails at start-up. Rewards: ``task.rewards`` is a
preset (``auto``: ``d1`` for chat prompts, ``plain`` for compact ones) or a ``{name: weight}``
mapping over the task's reward functions (:meth:`TextTask.reward_catalogue`). Presets: ``d1`` = d1's
own reward functions, quirks included (``rewards/d1/rewards.py``); ``d1_fixed`` = the same terms
corrected (the default for chat prompts); ``plain`` = correctness only (compact prompts).
"""

from __future__ import annotations

import functools
import string
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards import gsm8k as gsm8k_rewards  # module objects: rewards import tasks.base
from diffusion_rl.tasks.base import RewardFn, Task, TaskConfig

PROMPT_STYLES = ("compact", "chat")

# diffu-grpo's training format prompt (d1), the system text of chat training prompts
D1_FORMAT_SYSTEM = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
# d1's evaluation prompt for the math tasks: reason, then the answer in \boxed{}
MATH_EXPERT = ("You are a math expert. You will be given a question to solve. Solve it step by step. "
               "Wrap the final answer in a \\boxed{}.\n")
BOXED_EVAL_SYSTEM = (MATH_EXPERT + "Respond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
                     "<answer>\n\\boxed{...}\n</answer>")


@dataclass
class TextTaskConfig(TaskConfig):
    prompt_style: str = "chat"  # compact (embedded char model) | chat (instruction-tuned LMs)
    compact_template: str = ""  # compact: the whole prompt
    chat_train_system: str = D1_FORMAT_SYSTEM  # chat, training: the system text before the user turn
    chat_eval_system: str = BOXED_EVAL_SYSTEM  # chat, evaluation
    chat_user_template: str = ""
    eval_prefill: str = "<reasoning>"  # chat only: ends the evaluation prompt, starts the response
    rewards: str | dict[str, float] = "auto"  # auto | d1 | d1_fixed | plain | {name: weight}
    num_train: int | None = None  # at most this many training items (seeded subset); null: all
    train_data_path: str | None = None  # local training JSONL; null: the hub (or the generator)
    hub_id: str = ""
    hub_config: str | None = None

    def validate(self) -> None:
        super().validate()
        if self.prompt_style not in PROMPT_STYLES:
            raise ConfigError("task.prompt_style", self.prompt_style, f"allowed: {', '.join(PROMPT_STYLES)}")
        if self.num_train is not None and self.num_train < 1:
            raise ConfigError("task.num_train", self.num_train, "must be >= 1 or null (all)")
        if isinstance(self.rewards, dict):
            if not self.rewards:
                raise ConfigError("task.rewards", self.rewards, "must name at least one reward")
            for name, w in self.rewards.items():
                if isinstance(w, bool) or not isinstance(w, int | float):
                    raise ConfigError(f"task.rewards.{name}", w, "must be a number (the weight)")


def _as_answer(fn: RewardFn) -> RewardFn:
    """Score a compact completion (the bare answer) as ``<answer>{completion}</answer>``."""

    @functools.wraps(fn)
    def wrapped(prompts: list[str], completions: list[str], **fields: Any) -> list[float]:
        tagged = [f"<answer>{c}</answer>" if isinstance(c, str) else c for c in completions]
        return fn(prompts, tagged, **fields)

    return wrapped


def render_chat(tokenizer: Any, content: str) -> str:
    """One user turn through the tokenizer's chat template, ready for the assistant's reply."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": content}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return content + "\n"


class TextTask(Task):
    """Base of the text benchmarks; subclasses supply data, template fields, answers and rewards."""

    config_class: type[TaskConfig] = TextTaskConfig
    cfg: TextTaskConfig
    template_fields: tuple[str, ...] = ()
    correct_reward: float = 2.0  # the "correct" function's value for a right answer
    metric_help = {"accuracy": "share of items whose answer the task's correctness reward accepts (the papers' metric)"}

    def __init__(self, cfg: TextTaskConfig):
        super().__init__(cfg)
        self.tokenizer: Any = None
        self._check_templates()
        self._rewards = self._resolve_rewards()

    # ---- what subclasses provide --------------------------------------------------------------
    @abstractmethod
    def load_train(self) -> list[dict[str, Any]]:
        """Training items, disjoint from :meth:`load_test`'s; called once (cached)."""

    @abstractmethod
    def load_test(self) -> list[dict[str, Any]]:
        """Held-out items (all of them unless ``num_test`` caps them); called once (cached)."""

    @functools.cached_property
    def _train(self) -> list[dict[str, Any]]:
        return self.load_train()

    @functools.cached_property
    def _test(self) -> list[dict[str, Any]]:
        return self.load_test()

    def train_items(self) -> list[dict[str, Any]]:
        return list(self._train)

    def test_items(self) -> list[dict[str, Any]]:
        return list(self._test)

    @abstractmethod
    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        """Values of :attr:`template_fields` for one item."""

    @abstractmethod
    def answer(self, item: dict[str, Any]) -> str:
        """The gold answer as the model should write it (inside ``<answer>`` for chat prompts)."""

    @abstractmethod
    def reasoning(self, item: dict[str, Any]) -> str:
        """A worked solution for the chat target's ``<reasoning>`` block."""

    @abstractmethod
    def reward_catalogue(self) -> dict[str, RewardFn]:
        """Reward functions ``task.rewards`` may name; ``"correct"`` is the correctness reward."""

    @abstractmethod
    def reward_presets(self) -> dict[str, dict[str, float]]:
        """``{"d1": {...}, "d1_fixed": {...}, "plain": {...}}`` weights over :meth:`reward_catalogue` names."""

    # ---- prompts ------------------------------------------------------------------------------
    def use_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @property
    def compact(self) -> bool:
        return self.cfg.prompt_style == "compact"

    def prompt(self, item: dict[str, Any]) -> str:
        if self.compact:
            return self.cfg.compact_template.format(**self.fields(item))
        return self._chat(self.cfg.chat_train_system, item)

    def eval_prompt(self, item: dict[str, Any]) -> str:
        if self.compact:
            return self.prompt(item)
        return self._chat(self.cfg.chat_eval_system, item) + self.cfg.eval_prefill

    @property
    def eval_prefill(self) -> str:
        return "" if self.compact else self.cfg.eval_prefill

    def _chat(self, system: str, item: dict[str, Any]) -> str:
        user = self.cfg.chat_user_template.format(**self.fields(item))
        return render_chat(self.tokenizer, f"{system}\n\n{user}" if system else user)

    def target(self, item: dict[str, Any]) -> str:
        if self.compact:
            return self.answer(item)
        return f"<reasoning>\n{self.reasoning(item)}\n</reasoning>\n<answer>\n{self.answer(item)}\n</answer>\n"

    def hint_reference(self, item: dict[str, Any]) -> str:
        """The gold completion (:meth:`target`): the worked reasoning and the answer for chat prompts, the
        bare answer for compact ones; IGPO cuts its hints from it."""
        return self.target(item)

    def _check_templates(self) -> None:
        used = ["compact_template"] if self.compact else ["chat_user_template"]
        for key in used + (["chat_train_system", "chat_eval_system"] if not self.compact else []):
            template = getattr(self.cfg, key)
            if key in used and not template.strip():
                raise ConfigError(f"task.{key}", template, f"must be set for prompt_style={self.cfg.prompt_style}")
            if key.endswith("_system"):
                continue  # literal text, never formatted
            try:
                names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as err:
                raise ConfigError(f"task.{key}", template, f"not a format string ({err}); double literal braces") from err
            unknown = sorted(names - set(self.template_fields))
            if unknown:
                raise ConfigError(
                    f"task.{key}", template,
                    f"unknown field {{{unknown[0]}}}; allowed: {', '.join('{' + f + '}' for f in self.template_fields)}",
                )

    # ---- rewards and metrics ------------------------------------------------------------------
    def _resolve_rewards(self) -> list[tuple[str, RewardFn, float]]:
        spec = self.cfg.rewards
        presets = self.reward_presets()
        if isinstance(spec, str):
            # auto: our corrected d1 set for chat prompts (a task without one, e.g. code, gets its "d1")
            chat_default = "d1_fixed" if "d1_fixed" in presets else "d1"
            name = ("plain" if self.compact else chat_default) if spec == "auto" else spec
            if name not in presets:
                raise ConfigError("task.rewards", spec, f"allowed presets: auto, {', '.join(presets)}; or a {{name: weight}} mapping")
            spec = presets[name]
        catalogue = self.reward_catalogue()
        out = []
        for name, weight in spec.items():
            if name not in catalogue:
                raise ConfigError("task.rewards", name, f"unknown reward; allowed: {', '.join(sorted(catalogue))}")
            out.append((name, self.as_scored(catalogue[name]), float(weight)))
        return out

    def reward_functions(self) -> list[tuple[str, RewardFn, float]]:
        return list(self._rewards)

    def as_scored(self, fn: RewardFn) -> RewardFn:
        """A catalogue function as the task applies it: a compact completion is the bare answer, scored
        as ``<answer>{completion}</answer>``."""
        return _as_answer(fn) if self.compact else fn

    def correctness_reward(self) -> RewardFn:
        """The reward function behind :meth:`correctness` (the catalogue's ``correct``)."""
        return self.reward_catalogue()["correct"]

    def correctness(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> list[bool]:
        """Whether each completion's answer is right (the ``correct`` reward at full value)."""
        fn = self.as_scored(self.correctness_reward())
        fields = {k: [it.get(k) for it in items] for k in items[0]} if items else {}
        prompts = [""] * len(completions)
        return [v >= self.correct_reward for v in fn(prompts, list(completions), **fields)]

    def metrics(self, completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, float]:
        """``accuracy`` (the share of right answers: the papers' metric) and the mean ``reward``."""
        right = self.correctness(completions, items)
        n = max(len(right), 1)
        return {"accuracy": sum(right) / n, "reward": float(self.rewards(completions, items).sum()) / n}


def format_catalogue() -> dict[str, RewardFn]:
    """d1's task-agnostic format terms, available to every text task."""
    return {
        "xml_count": gsm8k_rewards.xml_count_reward,
        "soft_format": gsm8k_rewards.soft_format_reward,
        "strict_format": gsm8k_rewards.strict_format_reward,
    }
