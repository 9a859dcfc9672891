"""Countdown, GSM8K and MATH500 tasks: loaders (shared files, hub calls), the Countdown generator,
prompt templates, rewards from config, and the reference policy scoring 100% through the eval code.

The benchmark files come from tests/fixtures/ (see its README.md). Run: pytest tests/unit/tasks/test_text_tasks.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffusion_rl.app.evaluate import evaluate_checkpoint
from diffusion_rl.app.train import build_task
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.tokenizer import CharTokenizer
from diffusion_rl.rewards import safe_eval_arith, solve_countdown
from diffusion_rl.tasks.countdown import canonical_solution, generate_instances, instance_key
from tests.conftest import CONF, FIXTURES
from tests.helpers.common import compose_cfg

CD3 = FIXTURES / "countdown" / "countdown_cd3_test.jsonl"
GSM_TEST = FIXTURES / "gsm8k" / "gsm8k_test.jsonl"
GSM_TRAIN = FIXTURES / "gsm8k" / "gsm8k_train_first500.jsonl"  # the first 500 of the 7473 train rows
MATH_TEST = FIXTURES / "math500" / "math500_test.jsonl"
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"


def compose_eval(overrides: list[str], tmp_path: Path):
    """The config of src/eval.py (conf/eval.yaml), with the tiny model settings of the tests."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="eval", overrides=[f"paths.cache_dir={tmp_path / 'cache'}", "eval.progress=false",
                                                      *overrides])


def make_task(tmp_path: Path, name: str, *overrides: str):
    return build_task(compose_cfg([f"task={name}", *overrides], tmp_path, tiny=False).task)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- loaders ------------------------------------------------------------------------------------
def test_loaders_read_the_benchmark_files(tmp_path):
    gsm = make_task(tmp_path, "gsm8k", f"task.data_path={GSM_TEST}", f"task.train_data_path={GSM_TRAIN}")
    test, train = gsm.test_items(), gsm.train_items()
    assert len(test) == 1319 and set(test[0]) == {"question", "answer"}
    assert test[0]["question"].startswith("Janet")  # file order kept
    assert len(train) == 500 - len({it["question"] for it in test} & {it["question"] for it in train})
    assert all(gsm.gold(it).lstrip("-").replace(".", "").isdigit() for it in test)

    math = make_task(tmp_path, "math500", f"task.data_path={MATH_TEST}")
    items = math.test_items()
    assert len(items) == 500 and all(it["answer"] and it["problem"] for it in items)

    cd = make_task(tmp_path, "countdown", f"task.data_path={CD3}")
    items = cd.test_items()
    assert len(items) == 256 and items[0] == {"numbers": [30, 100, 93], "target": 23}
    assert all(len(it["numbers"]) == 3 and isinstance(it["target"], int) for it in items)
    assert not {instance_key(it) for it in items} & {instance_key(it) for it in cd.train_items()}

    assert len(make_task(tmp_path, "gsm8k", f"task.data_path={GSM_TEST}", "task.num_test=7").test_items()) == 7


def test_local_files_in_the_shared_formats(tmp_path):
    test = write_jsonl(tmp_path / "t.jsonl", [{"question": "q1", "answer": "x\n#### 3"}, {"question": "q2", "answer": "#### 4"}])
    train = write_jsonl(tmp_path / "tr.jsonl", [{"question": "q1", "answer": "#### 3"}, {"question": "q3", "answer": "#### 5"}])
    task = make_task(tmp_path, "gsm8k", f"task.data_path={test}", f"task.train_data_path={train}")
    assert [it["question"] for it in task.train_items()] == ["q3"]  # a test question never trains
    cd = write_jsonl(tmp_path / "cd.jsonl", [{"input": "1,2,3", "output": "6"}, {"nums": [4, 5, 6], "target": 15}])
    task = make_task(tmp_path, "countdown", f"task.data_path={cd}", "task.num_train=50")
    assert task.test_items() == [{"numbers": [1, 2, 3], "target": 6}, {"numbers": [4, 5, 6], "target": 15}]
    math_train = write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "solution": "so \\boxed{\\frac{1}{2}}."}])
    task = make_task(tmp_path, "math500", f"task.data_path={math_train}", f"task.train_data_path={math_train}")
    with pytest.raises(ConfigError, match="task.data_path"):
        task.test_items()  # a test file needs the answer column
    task = make_task(tmp_path, "math500", f"task.train_data_path={math_train}",
                     f"task.data_path={write_jsonl(tmp_path / 'mt.jsonl', [{'problem': 'q', 'answer': '1'}])}")
    assert task.train_items() == [{"problem": "p", "answer": "\\frac{1}{2}", "solution": "so \\boxed{\\frac{1}{2}}."}]


@pytest.mark.parametrize("name", ["countdown", "gsm8k", "math500"])
def test_missing_file_fails_in_one_line_naming_the_path(tmp_path, name):
    missing = tmp_path / "nope" / "test.jsonl"
    task = make_task(tmp_path, name, f"task.data_path={missing}")
    with pytest.raises(ConfigError) as err:
        task.test_items()
    assert "task.data_path" in str(err.value) and str(missing) in str(err.value) and "\n" not in str(err.value)


def test_missing_columns_and_bad_json_fail_in_one_line(tmp_path):
    bad = write_jsonl(tmp_path / "b.jsonl", [{"q": "x", "answer": "#### 1"}])
    with pytest.raises(ConfigError, match="missing column.*question"):
        make_task(tmp_path, "gsm8k", f"task.data_path={bad}").test_items()
    (tmp_path / "c.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match="not a readable JSONL"):
        make_task(tmp_path, "gsm8k", f"task.data_path={tmp_path / 'c.jsonl'}").test_items()


# ---- hub loading (datasets.load_dataset is replaced: tests never reach the hub) ----------------
@pytest.fixture
def fake_hub(monkeypatch):
    import datasets

    calls = []
    rows = {
        "openai/gsm8k": [{"question": "q", "answer": "w\n#### 7"}],
        "HuggingFaceH4/MATH-500": [{"problem": "p", "solution": "s", "answer": "3", "subject": "A", "level": 1, "unique_id": "u"}],
        "EleutherAI/hendrycks_math": [{"problem": "t", "level": "1", "type": "A", "solution": "so \\boxed{5}"}],
        "Jiayi-Pan/Countdown-Tasks-3to4": [{"target": 6, "nums": [1, 2, 3]}, {"target": 10, "nums": [1, 2, 3, 4]},
                                           {"target": 15, "nums": [4, 5, 6]}, {"target": 9, "nums": [2, 3, 4]}],
    }

    def load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        if path not in rows:
            raise ConnectionError("offline")
        return datasets.Dataset.from_list(rows[path])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hub_ids_configs_and_splits(tmp_path, fake_hub):
    gsm = make_task(tmp_path, "gsm8k")
    assert gsm.test_items() == [{"question": "q", "answer": "w\n#### 7"}] and gsm.train_items() == []  # same question
    assert fake_hub == [("openai/gsm8k", "main", "test"), ("openai/gsm8k", "main", "train")]
    fake_hub.clear()
    math = make_task(tmp_path, "math500")
    assert math.test_items()[0]["answer"] == "3" and math.train_items()[0]["answer"] == "5"
    assert fake_hub[0] == ("HuggingFaceH4/MATH-500", None, "test")
    assert sorted(c[1] for c in fake_hub[1:]) == ["algebra", "counting_and_probability", "geometry",
                                                   "intermediate_algebra", "number_theory", "prealgebra", "precalculus"]
    assert {c[0] for c in fake_hub[1:]} == {"EleutherAI/hendrycks_math"} and {c[2] for c in fake_hub[1:]} == {"train"}
    fake_hub.clear()
    cd = make_task(tmp_path, "countdown", "task.source=hub", "task.num_test=1")
    train, test = cd.train_items(), cd.test_items()
    assert fake_hub == [("Jiayi-Pan/Countdown-Tasks-3to4", None, "train")]
    assert len(train) + len(test) == 3 and all(len(it["numbers"]) == 3 for it in train + test)  # 4-number row dropped


def test_hub_failure_is_one_line_with_the_offline_hint(tmp_path, fake_hub):
    task = make_task(tmp_path, "gsm8k", "task.hub_id=nobody/nothing")
    with pytest.raises(ConfigError, match="task.hub_id='nobody/nothing'.*offline") as err:
        task.test_items()
    assert "\n" not in str(err.value)


# ---- the Countdown generator --------------------------------------------------------------------
def test_generator_instances_are_solvable_distinct_and_in_range():
    items = generate_instances(300, "s", 1, 100, 1, 100)
    assert len(items) == len({instance_key(it) for it in items}) == 300
    for it in items:
        assert len(it["numbers"]) == 3 and all(1 <= n <= 100 for n in it["numbers"]) and 1 <= it["target"] <= 100
        assert safe_eval_arith(it["solution"]) == it["target"]
        assert sorted(int(t) for t in it["solution"].replace("(", " ").replace(")", " ").replace("+", " ")
                      .replace("-", " ").replace("*", " ").replace("/", " ").split()) == sorted(it["numbers"])
        assert solve_countdown(it["numbers"], it["target"]) is not None  # an independent check


def test_generator_is_seeded_and_train_test_disjoint(tmp_path):
    assert generate_instances(50, "a", 1, 100, 1, 100) == generate_instances(50, "a", 1, 100, 1, 100)
    assert generate_instances(50, "a", 1, 100, 1, 100) != generate_instances(50, "b", 1, 100, 1, 100)
    small = generate_instances(10_000, "c", 1, 3, 1, 5)  # a tiny range holds few instances: no hang
    assert 0 < len(small) < 100
    task = make_task(tmp_path, "countdown", "task.num_train=500", "task.num_test=100")
    again = make_task(tmp_path, "countdown", "task.num_train=500", "task.num_test=100")
    assert task.train_items() == again.train_items() and task.test_items() == again.test_items()
    assert not {instance_key(it) for it in task.train_items()} & {instance_key(it) for it in task.test_items()}
    # the data follows the warm start's seed (what RL seeds share), not the RL seed
    assert make_task(tmp_path, "countdown", "task.num_train=500", "task.num_test=100", "seed=1").train_items() \
        == task.train_items()
    other = make_task(tmp_path, "countdown", "task.num_train=500", "task.num_test=100", "warmstart.seed=1")
    assert other.train_items() != task.train_items()


def _numbers_in(expr: str) -> list[int]:
    for op in "()+-*/":
        expr = expr.replace(op, " ")
    return [int(t) for t in expr.split()]


def test_canonical_solution_is_a_valid_expression_in_the_given_order_first():
    assert canonical_solution([30, 100, 93], 23) == "30-100+93"  # the given order works: kept
    assert canonical_solution([2, 2, 2], 8) == "(2+2)*2"  # brackets only where needed
    assert canonical_solution([5, 2, 3], 1) == "(5-2)/3" and canonical_solution([8, 2, 5], 20) == "8/2*5"
    assert canonical_solution([12, 3, 4], 13) == "12-3+4"
    assert canonical_solution([4, 12, 3], 13) == "4+12-3"  # another order of the same numbers: its own
    assert canonical_solution([7, 7, 7], 1) is None  # unsolvable with integer steps
    assert canonical_solution([1, 2], 3) is None  # only 3-number instances
    for it in generate_instances(300, "canon", 1, 100, 1, 100):  # every generated instance has one
        expr = canonical_solution(it["numbers"], it["target"])
        assert safe_eval_arith(expr) == it["target"] and sorted(_numbers_in(expr)) == sorted(it["numbers"])
        assert canonical_solution(list(reversed(it["numbers"])), it["target"]) is not None


def test_countdown_warm_start_targets_follow_task_solution(tmp_path):
    item = generate_instances(1, "x", 1, 100, 1, 100)[0]
    canon = make_task(tmp_path, "countdown")
    gen = make_task(tmp_path, "countdown", "task.solution=generated")
    assert canon.target(item) == canonical_solution(item["numbers"], item["target"])
    assert gen.target(item) == item["solution"]
    with pytest.raises(ConfigError, match="task.solution"):
        make_task(tmp_path, "countdown", "task.solution=shortest")


# ---- prompts ------------------------------------------------------------------------------------
def test_compact_prompts_and_targets(tmp_path):
    cd = make_task(tmp_path, "countdown")
    item = {"numbers": [30, 100, 93], "target": 23}
    assert cd.prompt(item) == cd.eval_prompt(item) == "30,100,93->23:" and cd.eval_prefill == ""
    assert safe_eval_arith(cd.target(item)) == 23
    assert cd.rewards([cd.target(item), "30+93-100", "30+93", ""], [item] * 4).tolist() == pytest.approx([1, 1, 0.1, 0.1])
    gsm = make_task(tmp_path, "gsm8k", "task.prompt_style=compact")
    g = {"question": "How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}
    assert gsm.prompt(g) == "How many?\nA:" and gsm.target(g) == "7"


def test_chat_prompts_use_the_chat_template_and_differ_between_training_and_evaluation(tmp_path):
    gsm = make_task(tmp_path, "gsm8k")
    item = {"question": "How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}
    tok = CharTokenizer()
    assert gsm.prompt(item) == gsm.cfg.chat_train_system + "\n\nHow many?\n"  # no chat template: plain turn
    tok.chat_template = CHAT_TEMPLATE
    gsm.use_tokenizer(tok)
    train, ev = gsm.prompt(item), gsm.eval_prompt(item)
    assert train == f"<|user|>{gsm.cfg.chat_train_system}\n\nHow many?<|assistant|>"
    assert ev == f"<|user|>{gsm.cfg.chat_eval_system}\n\nHow many?<|assistant|><reasoning>"
    assert "\\boxed" in ev and "\\boxed" not in train and gsm.eval_prefill == "<reasoning>"
    target = gsm.target(item)
    assert target == "<reasoning>\n3 + 4 = 7\n</reasoning>\n<answer>\n7\n</answer>\n"
    assert gsm.rewards([target], [item]).item() == pytest.approx(4.0)  # d1's composite at its maximum
    math = make_task(tmp_path, "math500")
    assert "\\boxed{1/2}" in math.target({"problem": "p", "answer": "1/2", "solution": "s"})


def test_template_and_style_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"task.compact_template.*unknown field \{nums\}; allowed: \{numbers\}"):
        make_task(tmp_path, "countdown", "task.compact_template='{nums}->{target}:'")
    with pytest.raises(ConfigError, match="task.prompt_style='fancy'.*allowed: compact, chat"):
        make_task(tmp_path, "gsm8k", "task.prompt_style=fancy")
    with pytest.raises(ConfigError, match="task.chat_user_template.*must be set"):
        make_task(tmp_path, "gsm8k", "task.chat_user_template=''")


# ---- rewards from config ------------------------------------------------------------------------
def test_reward_presets_weights_and_strict_string(tmp_path):
    item = {"question": "q", "answer": "#### 72"}
    fixed = make_task(tmp_path, "gsm8k")  # auto = d1_fixed for chat prompts
    assert [n for n, _, _ in fixed.reward_functions()] == ["xml_count", "soft_format", "strict_format", "int", "correct"]
    d1 = make_task(tmp_path, "gsm8k", "task.rewards=d1")
    assert [n for n, _, _ in d1.reward_functions()] == [
        "d1_xml_count", "d1_soft_format", "d1_strict_format", "d1_int", "d1_correct"]
    plain = make_task(tmp_path, "gsm8k", "task.rewards=plain")
    assert [n for n, _, _ in plain.reward_functions()] == ["correct"]
    assert [n for n, _, _ in make_task(tmp_path, "gsm8k", "task.prompt_style=compact").reward_functions()] == ["correct"]
    mixed = make_task(tmp_path, "gsm8k", "task.rewards={correct: 0.5, int: 2.0}")
    assert mixed.rewards(["<answer>72</answer>"], [item]).item() == pytest.approx(0.5 * 2.0 + 2.0 * 0.5)
    assert plain.rewards(["<answer>72.0</answer>"], [item]).item() == 2.0
    strict = make_task(tmp_path, "gsm8k", "task.rewards=plain", "task.strict_string=true")
    assert strict.rewards(["<answer>72.0</answer>", "<answer>72</answer>"], [item] * 2).tolist() == [0.0, 2.0]
    with pytest.raises(ConfigError, match="task.rewards='bogus'.*allowed: correct, d1_correct, d1_int"):
        make_task(tmp_path, "gsm8k", "task.rewards={bogus: 1.0}")
    with pytest.raises(ConfigError, match="allowed presets: auto, d1, d1_fixed, plain"):
        make_task(tmp_path, "math500", "task.rewards=fancy")
    math = make_task(tmp_path, "math500")
    assert math.rewards(["<answer>\\boxed{0.5}</answer>"], [{"problem": "p", "answer": "\\frac{1}{2}"}]).item() == 2.5


# ---- the reference policy through the evaluation code -------------------------------------------
FILE_CASES = [
    ("countdown", CD3, "compact"), ("countdown", CD3, "chat"),
    ("gsm8k", GSM_TEST, "chat"), ("gsm8k", GSM_TEST, "compact"),
    ("math500", MATH_TEST, "chat"), ("math500", MATH_TEST, "compact"),
]


def _reference_eval(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = compose_eval([f"task={name}", "policy=reference", "eval.gen_lengths=[32]", *overrides], tmp_path)
    summary = evaluate_checkpoint(cfg, tmp_path / "run")
    records = [json.loads(line) for line in open(tmp_path / "run" / "generations.jsonl")]
    return summary, records


@pytest.mark.parametrize("name,path,style", FILE_CASES, ids=[f"{n}-{s}" for n, _, s in FILE_CASES])
def test_reference_policy_scores_100_percent_on_benchmark_files(tmp_path, name, path, style):
    summary, records = _reference_eval(tmp_path, name, f"task.data_path={path}", f"task.prompt_style={style}",
                                       "task.num_test=100000")
    assert summary["num_items"] == sum(1 for line in open(path) if line.strip())
    assert summary["by_length"]["32"]["accuracy"] == 1.0 and all(r["correct"] for r in records)


@pytest.mark.parametrize("name,metric", [("countdown", "accuracy"), ("sudoku", "solved_rate")])
def test_reference_policy_scores_100_percent_on_generated_items(tmp_path, name, metric):
    summary, records = _reference_eval(tmp_path, name, "task.num_test=64", "task.num_train=64")
    assert summary[metric] == 1.0 and len(records) == 64
    if name == "sudoku":
        assert summary["cell_accuracy"] == 1.0 and summary["valid_rate"] == 1.0


def test_countdown_cpu_experiment_sets_task_and_root_keys(tmp_path):
    """An experiment composes after the root config, so its warm-start length is not overridden."""
    cfg = compose_cfg(["experiment=countdown_cpu"], tmp_path, tiny=False)
    assert cfg.task.name == "countdown" and (cfg.task.max_number, cfg.task.max_target) == (9, 30)
    assert cfg.warmstart.steps == 900 and cfg.task.solution == "canonical"
    assert compose_cfg(["experiment=countdown_cpu", "warmstart.steps=5"], tmp_path, tiny=False).warmstart.steps == 5
