"""What every task inherits (tasks/base.py) on a hand-made task: the composite reward and its
components, a reward function that raises costing one completion, the pinned canvas, the shared
config's edges and the log line's shortening."""

import logging

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.tasks.base import Task, TaskConfig, _short, single_token


def length(prompts, completions, **_):
    return [float(len(c)) for c in completions]


def fussy(prompts, completions, answer, **_):
    """Raises on a batch holding "boom"; one call per completion then scores the others."""
    if "boom" in completions:
        raise ValueError("a reward bug")
    return [float(c == a) for c, a in zip(completions, answer)]


class Toy(Task):
    def train_items(self):
        return [{"answer": "ab"}]

    def test_items(self):
        return [{"answer": "ab"}]

    def prompt(self, item):
        return "p"

    def target(self, item):
        return item["answer"]

    def reward_functions(self):
        return [("length", length, 0.5), ("exact", fussy, 2.0)]

    def metrics(self, completions, items):
        return {}

    def pinned_completion(self, item):
        return item.get("pins")


def test_the_composite_reward_is_the_weighted_sum_of_unweighted_components():
    task = Toy(TaskConfig(failure_reward=-1.0))
    items = [{"answer": "ab"}, {"answer": "x"}, {"answer": "abc"}]
    total, parts = task.score(["ab", "xyz", "abc"], items)
    assert parts["length"].tolist() == [2.0, 3.0, 3.0] and parts["exact"].tolist() == [1.0, 0.0, 1.0]
    assert total.tolist() == pytest.approx([0.5 * 2 + 2.0, 0.5 * 3, 0.5 * 3 + 2.0])
    assert torch.equal(task.rewards(["ab", "xyz", "abc"], items), total)


def test_a_raising_reward_costs_one_completion_and_warns_once(caplog):
    task = Toy(TaskConfig(failure_reward=-1.0))
    items = [{"answer": "ab"}, {"answer": "boom"}, {"answer": "zz"}]
    with caplog.at_level(logging.WARNING):
        total, parts = task.score(["ab", "boom", "zz"], items)
        task.score(["boom", "ab"], items[:2])
    assert parts["exact"].tolist() == [1.0, -1.0, 1.0]  # the others are scored one by one
    assert total.tolist() == pytest.approx([0.5 * 2 + 2.0, 0.5 * 4 - 2.0, 0.5 * 2 + 2.0])
    assert task.reward_failures == 2
    assert caplog.text.count("reward exact raised") == 1  # once per function, not per completion


def test_the_canvas_pins_each_item_s_tokens_and_masks_the_rest(tiny_bundle):
    task = Toy(TaskConfig())
    tok = tiny_bundle.tokenizer
    one, two = tok.decode([tok.encode("1", add_special_tokens=False)[0]]), tok.decode([tok.encode("2", add_special_tokens=False)[0]])
    assert task.canvas([{}, {}], tok, 4, 99) is None  # nothing pinned: no canvas
    items = [{"pins": [one, None, two, one, two]}, {}]  # a row longer than the canvas is cut
    canvas = task.canvas(items, tok, 4, 99)
    i1, i2 = single_token(tok, one), single_token(tok, two)
    assert canvas.dtype == torch.long and canvas.tolist() == [[i1, 99, i2, i1], [99] * 4]
    with pytest.raises(ConfigError, match=r"^task\.pin="):
        single_token(tok, one + two + one + "==")


def test_the_shared_task_config_edges():
    for ok in (dict(group_size=2), dict(prompts_per_batch=1), dict(num_test=1), dict(eval_batch_size=1),
               dict(num_val=0), dict(loss_mask="reward")):
        TaskConfig(**ok).validate()
    for bad, key in ((dict(group_size=1), "group_size"), (dict(prompts_per_batch=0), "prompts_per_batch"),
                     (dict(num_test=0), "num_test"), (dict(eval_batch_size=0), "eval_batch_size"),
                     (dict(num_val=-1), "num_val"), (dict(loss_mask="some"), "loss_mask")):
        with pytest.raises(ConfigError, match=rf"^task\.{key}\b"):
            TaskConfig(**bad).validate()


def test_a_long_text_is_shortened_for_a_log_line():
    assert _short("x" * 200) == "x" * 200
    assert _short("x" * 205) == "x" * 200 + "...[5 more chars]"
    assert _short("abcdef", limit=4) == "abcd...[2 more chars]"
