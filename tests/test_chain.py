"""The digit-chain task (tasks/chain.py) and its reward (rewards/chain.py), hand-checked."""

import pytest

from diffusion_rl.errors import ConfigError
from diffusion_rl.rewards.chain import chain_lines, chain_reward, next_line
from diffusion_rl.tasks.chain import ChainConfig, ChainTask


def test_rules_hand_computed():
    assert next_line("48213579", "rotate") == "82135794"
    assert next_line("48213579", "sum") == "20348269"  # 4+8, 8+2, 2+1, 1+3, 3+5, 5+7, 7+9, 9+0 (mod 10)
    assert chain_lines("1234", 3, "rotate") == ["2341", "3412", "4123"]
    with pytest.raises(ValueError, match="rule"):
        next_line("12", "reverse")


def test_reward_counts_lines_at_their_place():
    start, n = "1234", 3  # gold 2341;3412;4123
    r = chain_reward(["p"] * 5, ["2341;3412;4123", "2341;3412;9999", "9999;3412;4123", "2341;3412;4123;1234",
                                 "2341;34"], [start] * 5, [n] * 5, ["rotate"] * 5)
    assert r == pytest.approx([1.0, 2 / 3, 2 / 3, 1.0, 1 / 3])  # lines past n are ignored
    assert chain_reward(["p"], [None], [start], [n]) == [0.0]  # never raises


def test_task_items_prompts_targets_and_metrics():
    task = ChainTask(ChainConfig(num_train=300, num_test=40, rule="sum", min_lines=4, max_lines=6))
    test, train = task.test_items(), task.train_items()
    assert len(test) == 40 and len(train) == 300
    assert not {it["start"] for it in test} & {it["start"] for it in train}
    it = test[0]
    assert task.prompt(it) == f"{it['lines']:02d}:{it['start']};" and 4 <= it["lines"] <= 6
    assert len(task.target(it)) == 9 * it["lines"] - 1
    targets = [task.target(x) for x in test]
    assert task.metrics(targets, test) == {"line_accuracy": 1.0, "solved_rate": 1.0}
    assert task.rewards(targets, test).tolist() == [1.0] * 40
    wrong = [t[:-1] + ("0" if t[-1] != "0" else "1") for t in targets]  # the last digit of the last line
    m = task.metrics(wrong, test)
    assert m["solved_rate"] == 0.0 and m["line_accuracy"] == pytest.approx(
        sum(1 - 1 / x["lines"] for x in test) / 40)
    with pytest.raises(ConfigError, match="task.rule"):
        ChainConfig(rule="xor").validate()
    with pytest.raises(ConfigError, match="task.max_lines"):
        ChainConfig(min_lines=5, max_lines=4).validate()
