"""Reading d1's released generation files and the ``eval.protocol`` switch (evaluate.py).

Run: pytest tests/unit/app/test_evaluate.py -q
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from diffusion_rl.app.evaluate import (
    EvalProtocolConfig,
    check_protocol,
    is_d1_format,
    read_d1_generations,
    rescore_generations,
)
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.rewards.d1.scoring import D1_PROTOCOLS
from tests.unit.tasks.test_text_tasks import compose_eval, write_jsonl


def _d1_file(folder: Path, name: str, length: int, entries: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"generations": entries, "gen_length": length, "metrics": {}}))
    return path


def _gsm(q: str, text: str, gold: float | None) -> dict:
    return {"question": q, "generations": text, "ground_truth": gold}


def test_reads_a_folder_by_task_prefix_in_name_order(tmp_path):
    _d1_file(tmp_path, "gsm8k_instruct_128_64_1_generations.json", 128, [_gsm("q3", "\\boxed{3}", 3.0)])
    _d1_file(tmp_path, "gsm8k_instruct_128_64_0_generations.json", 128,
             [_gsm("q1", "\\boxed{1}", 1.0), _gsm("q2", "x", None)])
    _d1_file(tmp_path, "gsm8k_instruct_256_128_0_generations.json", 256, [_gsm("q1", "y", 1.0)])
    _d1_file(tmp_path, "math500_instruct_128_64_0_generations.json", 128,
             [{"question": "p", "generations": "g", "ground_truth": "5"}])
    records = read_d1_generations(tmp_path, "gsm8k")
    assert [(r["gen_length"], r["index"], r["question"]) for r in records] == [
        (128, 0, "q1"), (128, 1, "q2"), (128, 2, "q3"), (256, 0, "q1")]
    assert records[0]["item"] == {"question": "q1", "answer": "#### 1"}
    assert records[1]["item"]["answer"] == ""  # d1 could not read this gold (a negative number)
    assert records[0]["prefill"] == "<reasoning>" and records[0]["source"].endswith("_0_generations.json#0")
    math = read_d1_generations(tmp_path / "math500_instruct_128_64_0_generations.json", "math500")
    assert math[0]["item"] == {"problem": "p", "answer": "5"}


def test_items_from_d1s_golds():
    cd = D1_PROTOCOLS
    assert cd["countdown"].item("Numbers: [1, 2]\nTarget: 3", [[1, 2], 3]) == {"numbers": [1, 2], "target": 3}
    assert cd["sudoku"].item("Solve the following Sudoku puzzle: 4320004330100004\n", "4321124334122134") == {
        "puzzle": "4320004330100004", "solution": "4321124334122134"}
    assert cd["sudoku"].item("4320004330100004", "x")["puzzle"] == "4320004330100004"
    assert cd["gsm8k"].item("q", 0.5)["answer"] == "#### 0.5"


def test_the_tasks_own_items_give_the_golds_d1_lost(tmp_path):
    _d1_file(tmp_path, "gsm8k_x_128_64_0_generations.json", 128, [_gsm("q2", "<answer>\\boxed{-3}</answer>", None)])
    dataset = [{"question": "q2", "answer": "w\n#### -3"}]
    records = read_d1_generations(tmp_path, "gsm8k", dataset)
    assert records[0]["item"] == dataset[0]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "unreadable JSON"),
        (json.dumps([1, 2]), "not d1's format"),
        (json.dumps({"generations": [{"question": "q"}], "gen_length": 128}), "entry 0 lacks"),
        (json.dumps({"generations": [{"question": "q", "generations": "g", "ground_truth": [1]}], "gen_length": 1}),
         "entry 0 is not a countdown item"),
    ],
)
def test_bad_files_fail_in_one_line(tmp_path, content, match):
    path = tmp_path / "countdown_x_128_64_0_generations.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        read_d1_generations(path, "countdown")


def test_missing_paths_and_tasks(tmp_path):
    with pytest.raises(ConfigError, match="no such file or folder"):
        read_d1_generations(tmp_path / "nope", "gsm8k")
    with pytest.raises(ConfigError, match="no sudoku_\\*_generations.json"):
        read_d1_generations(tmp_path, "sudoku")
    with pytest.raises(ConfigError, match="gsm8k, math500, countdown, sudoku only"):
        read_d1_generations(tmp_path, "mbpp")


def test_format_detection():
    assert is_d1_format("x/gsm8k_generations.json") and not is_d1_format("run/generations.jsonl")


def test_protocol_is_validated():
    with pytest.raises(ConfigError, match="eval.protocol='papers'"):
        EvalProtocolConfig(protocol="papers").validate()
    with pytest.raises(ConfigError, match="not task=mbpp"):
        check_protocol("d1", SimpleNamespace(cfg=SimpleNamespace(name="mbpp")))  # type: ignore[arg-type]
    check_protocol("ours", SimpleNamespace(cfg=SimpleNamespace(name="mbpp")))  # type: ignore[arg-type]


def test_rescoring_d1_files_with_both_protocols(tmp_path):
    entries = [
        {"question": "Numbers: [49, 55, 53]\nTarget: 51", "generations": "\n</reasoning>\n<answer>\n\\boxed{49 + 55 - 53}"
         "\n</answer><|eot_id|><|endoftext|>", "ground_truth": [[49, 55, 53], 51]},
        {"question": "Numbers: [1, 2, 3]\nTarget: 6", "generations": "\n</reasoning>\n<answer>\n1+2+3\n</answer><|eot_id|>",
         "ground_truth": [[1, 2, 3], 6]},
    ]
    folder = tmp_path / "d1"
    _d1_file(folder, "countdown_instruct_128_64_0_generations.json", 128, entries)
    by_protocol = {}
    for protocol in ("d1", "ours"):  # task=countdown defaults to compact prompts: d1's files are read as chat
        cfg = compose_eval(["task=countdown", "mode=score", f"eval.protocol={protocol}", f"generations={folder}"],
                           tmp_path)
        summary = rescore_generations(cfg, tmp_path / protocol)
        records = [json.loads(line) for line in open(tmp_path / protocol / "generations.jsonl")]
        by_protocol[protocol] = (summary["accuracy"], [r["correct"] for r in records], records[0]["answer"])
    # d1 reads the box; without one it takes the whole completion, tags included: invalid
    assert by_protocol["d1"] == (0.5, [True, False], "49 + 55 - 53")
    assert by_protocol["ours"] == (1.0, [True, True], "49 + 55 - 53")


def test_our_jsonl_still_reads_and_can_take_the_d1_protocol(tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"gen_length": 16, "index": 0, "prefill": "<reasoning>",
                                                "completion": "\\boxed{-3}\n</answer>",
                                                "item": {"question": "q", "answer": "#### -3"}}])
    for protocol, right in (("d1", False), ("ours", True)):
        cfg = compose_eval(["task=gsm8k", "mode=score", f"eval.protocol={protocol}", f"generations={data}"], tmp_path)
        assert rescore_generations(cfg, tmp_path / protocol)["accuracy"] == float(right)
