"""The evaluation protocol and its entry point: lengths, greedy decoding, outputs per length,
re-scoring, checkpoints, and one subprocess run each of ``src/eval.py`` and ``src/train.py``.

Run: pytest tests/e2e/test_eval_cli.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import diffusion_rl.app.evaluate as ev_mod
from diffusion_rl.app.evaluate import evaluate_checkpoint, rescore_generations, run_eval
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig
from tests.conftest import FIXTURES, ROOT
from tests.helpers.common import TINY
from tests.unit.tasks.test_text_tasks import compose_eval, write_jsonl

TINY_MODEL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in open(run / "generations.jsonl")]


@pytest.fixture
def samplers(monkeypatch):
    """Record the sampler of every generate call (and still generate)."""
    seen = []
    real = ev_mod.generate_texts

    def spy(bundle, prompts, sampler, batch_size, **kw):
        seen.append(sampler)
        return real(bundle, prompts, sampler, batch_size, **kw)

    monkeypatch.setattr(ev_mod, "generate_texts", spy)
    return seen


def test_model_eval_writes_generations_and_a_summary_per_length(tmp_path, samplers):
    cfg = compose_eval(["policy=init", "task=countdown", "task.num_test=5", "task.num_train=50",
                        "eval.gen_lengths=[16,64]", "eval.batch_size=4", *TINY_MODEL], tmp_path)
    summary = evaluate_checkpoint(cfg, tmp_path / "run")
    # the papers' protocol: greedy, steps = gen_length / 2, blocks of 32 (the whole length when shorter)
    assert [(s.gen_length, s.block_length, s.steps, s.temperature) for s in samplers] == [(16, 16, 8, 0.0), (64, 32, 32, 0.0)]
    records = _records(tmp_path / "run")
    assert [r["gen_length"] for r in records] == [16] * 5 + [64] * 5
    for r in records:
        assert {"prompt", "completion", "answer", "gold", "reward", "correct", "item"} <= set(r)
        assert r["prompt"].endswith("->" + r["gold"] + ":") and min(abs(r["reward"] - v) for v in (0, 0.1, 1)) < 1e-6
    assert set(summary["by_length"]) == {"16", "64"} and summary["by_length"]["64"]["num_items"] == 5
    assert summary["accuracy"] == summary["by_length"]["16"]["accuracy"]
    table = (tmp_path / "run" / "eval_summary.md").read_text().splitlines()
    assert table[0].startswith("| countdown gen_length | accuracy | reward") and table[3].startswith("| 64 |")
    # what was scored, and one line per metric: the reader needs neither the JSON nor the source
    assert "Scored 5 items of the task's own test set (task.num_test=5)." in table
    assert "- `accuracy`: share of items whose expression uses each given number once and evaluates to the target" in table
    assert {line.split("`")[1] for line in table if line.startswith("- `")} == {"accuracy", "reward", "num_items"}
    assert json.load(open(tmp_path / "run" / "eval_summary.json"))["by_length"] == summary["by_length"]


def test_default_lengths_follow_the_prompt_style(tmp_path):
    task_chat = ev_mod.build_task(compose_eval(["task=gsm8k"], tmp_path).task)
    task_compact = ev_mod.build_task(compose_eval(["task=countdown"], tmp_path).task)
    proto = ev_mod.EvalProtocolConfig()
    sampler = ev_mod.SamplerConfig(gen_length=16, block_length=16, steps=8)
    assert ev_mod.gen_lengths(proto, task_chat, sampler) == [128, 256, 512]
    assert ev_mod.gen_lengths(proto, task_compact, sampler) == [16]
    s = ev_mod.protocol_sampler(sampler, 512, proto)
    assert (s.block_length, s.steps, s.steps_per_block) == (32, 256, 16)
    # the papers' order even from a random-order rollout sampler (conf/sampler/sudoku.yaml)
    assert ev_mod.protocol_sampler(replace(sampler, remasking="random"), 16, proto).remasking == "low_confidence"
    assert replace(sampler, remasking="random", kv_cache="prefix").as_exact().remasking == "low_confidence"


def test_rescoring_equals_the_original_scores_and_uses_the_current_config(tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"w\n#### {i}"} for i in range(4)])
    cfg = compose_eval(["task=gsm8k", f"task.data_path={data}", "policy=reference", "eval.gen_lengths=[128,256]"], tmp_path)
    original = evaluate_checkpoint(cfg, tmp_path / "gen")
    records = _records(tmp_path / "gen")
    again = run_eval(compose_eval(["task=gsm8k", "mode=score", f"generations={tmp_path / 'gen' / 'generations.jsonl'}"],
                                  tmp_path), tmp_path / "score")
    assert again["by_length"] == original["by_length"] and again["policy"] == "rescored"
    assert [r["reward"] for r in _records(tmp_path / "score")] == [r["reward"] for r in records]
    # a user edits a completion ("72.0"-style answer) and re-scores with d1's strict string comparison
    records[0]["completion"] = "\nwork\n</reasoning>\n<answer>\n0.0\n</answer>\n"
    write_jsonl(tmp_path / "edited.jsonl", records)
    for strict, acc in (("false", 1.0), ("true", 0.75)):
        out = rescore_generations(compose_eval(["task=gsm8k", "mode=score", f"task.strict_string={strict}",
                                                f"generations={tmp_path / 'edited.jsonl'}"], tmp_path), tmp_path / strict)
        assert out["by_length"]["128"]["accuracy"] == acc


def test_sudoku_checkpoint_eval_keeps_its_metrics(tmp_path):
    bundle = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"policy.{k}": v for k, v in bundle.net.state_dict().items()}}, ckpt)
    csv = tmp_path / "sudoku.csv"
    csv.write_text("Puzzle,Solution\n3102200002100320,3142243142131324\n0000000000000000,1234341221434321\n")
    cfg = compose_eval(["task=sudoku", f"ckpt_path={ckpt}", f"task.data_path={csv}", *TINY_MODEL], tmp_path)
    summary = evaluate_checkpoint(cfg, tmp_path / "run")
    saved = json.load(open(tmp_path / "run" / "eval_summary.json"))
    assert summary["gen_lengths"] == [16] and saved["num_items"] == 2  # compact prompts: the sampler's length
    assert {"cell_accuracy", "solved_rate", "valid_rate"} <= set(saved) and 0.0 <= saved["cell_accuracy"] <= 1.0
    assert saved["environment"]["packages"]["torch"] == torch.__version__
    with pytest.raises(ConfigError, match="ckpt_path.*no checkpoint file"):
        evaluate_checkpoint(compose_eval(["task=sudoku", f"ckpt_path={tmp_path / 'x.ckpt'}"], tmp_path), tmp_path / "r2")
    # a run folder stands for its checkpoints/last.ckpt, as with training's ckpt_path
    run = tmp_path / "train_run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt.rename(run / "checkpoints" / "last.ckpt")
    again = evaluate_checkpoint(compose_eval(["task=sudoku", f"ckpt_path={run}", f"task.data_path={csv}", *TINY_MODEL],
                                             tmp_path), tmp_path / "r3")
    assert again["cell_accuracy"] == summary["cell_accuracy"]
    with pytest.raises(ConfigError, match="ckpt_path.*no checkpoint file at .*last.ckpt"):
        evaluate_checkpoint(compose_eval(["task=sudoku", f"ckpt_path={tmp_path / 'r3'}"], tmp_path), tmp_path / "r4")


@pytest.mark.parametrize("overrides,match", [
    (["mode=bogus"], "mode='bogus' is invalid: allowed: generate, score"),
    (["policy=oracle"], "policy='oracle' is invalid: allowed: checkpoint, init, warmstart, reference"),
    ([], "ckpt_path=None is invalid: evaluate which model\\? give ckpt_path="),
    (["policy=init", "ckpt_path=run"], "ckpt_path='run' is invalid: policy=init evaluates no checkpoint"),
    (["mode=score"], "generations=None is invalid: mode=score needs generations="),
    (["mode=score", "generations=/nope.jsonl"], "generations='/nope.jsonl' is invalid: no such file"),
    (["policy=init", "eval.gen_lengths=[48]"], "eval.gen_lengths=48 is invalid: must be a multiple of eval.block_length=32"),
    (["policy=init", "eval.steps_per_token=2.0"], "eval.steps_per_token=2.0 is invalid: must be in"),
])
def test_eval_config_errors_are_one_line(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        run_eval(compose_eval(["task=countdown", "task.num_test=2", *overrides], tmp_path), tmp_path / "run")


def _run(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "src" / script), *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


def test_eval_py_reference_policy_scores_100_percent(tmp_path):
    cd3 = FIXTURES / "countdown" / "countdown_cd3_test.jsonl"
    out = _run("eval.py", ["policy=reference", "task=countdown", "eval.progress=false", "eval.gen_lengths=[16,32]",
                           f"hydra.run.dir={tmp_path / 'ev'}", f"task.data_path={cd3}"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.load(open(tmp_path / "ev" / "eval_summary.json"))
    assert summary["by_length"]["16"]["accuracy"] == summary["by_length"]["32"]["accuracy"] == 1.0
    assert summary["num_items"] == 256
    assert "| 32 | 1.0000 |" in out.stdout
    assert f"Scored all 256 items of {cd3}." in out.stdout.splitlines()  # the printed summary says what was scored
    assert "- `accuracy`: share of items whose expression uses each given number once" in out.stdout


def _sudoku_csv(path: Path, rows: int) -> Path:
    from diffusion_rl.tasks.sudoku import SudokuConfig, SudokuTask

    items = SudokuTask(SudokuConfig(num_test=rows, test_fraction=0.9)).test_items()
    assert len(items) == rows
    path.write_text("Puzzle,Solution\n" + "".join(f"{it['puzzle']},{it['solution']}\n" for it in items))
    return path


def test_a_named_test_file_is_evaluated_whole_unless_capped(tmp_path):
    csv = _sudoku_csv(tmp_path / "puzzles.csv", 300)  # more rows than the 256 generated by default
    whole = run_eval(compose_eval(["policy=reference", "task=sudoku", f"task.data_path={csv}"], tmp_path), tmp_path / "a")
    assert whole["num_items"] == whole["by_length"]["16"]["num_items"] == 300
    assert whole["scored"] == f"all 300 items of {csv}" and whole["solved_rate"] == 1.0
    capped = run_eval(compose_eval(["policy=reference", "task=sudoku", f"task.data_path={csv}", "task.num_test=10"],
                                   tmp_path), tmp_path / "b")
    assert capped["num_items"] == 10
    assert capped["scored"] == f"10 of the 300 items of {csv} (task.num_test=10; task.num_test=null scores all)"
    assert f"Scored {capped['scored']}." in (tmp_path / "b" / "eval_summary.md").read_text()


def test_policy_warmstart_uses_the_training_runs_cached_warm_start(tmp_path):
    from diffusion_rl.app.train import warm_start_key
    from diffusion_rl.training.warmstart import cache_key

    args = ["policy=warmstart", "task=sudoku", "task.num_test=4", "task.num_train=32", "warmstart.steps=2",
            "warmstart.batch_size=4", *TINY_MODEL]
    cfg = compose_eval(args, tmp_path)
    out = evaluate_checkpoint(cfg, tmp_path / "ev", overrides=args)
    assert out["policy"] == "warmstart" and out["num_items"] == 4
    # the file a training run with the same model, task and seed would write and reuse
    from dataclasses import asdict

    from diffusion_rl.training.warmstart import WarmStartConfig, numerics

    ws = WarmStartConfig(steps=2, batch_size=4, seed=0)
    key = cache_key({"warmstart": asdict(ws), "gen_length": 16, "numerics": numerics(), **warm_start_key(cfg)})
    assert (tmp_path / "cache" / "warmstart" / f"{key}.pt").is_file()


def test_train_py_runs_countdown(tmp_path):
    out = _run("train.py", ["task=countdown", *TINY, "trainer.max_steps=2", f"paths.cache_dir={tmp_path / 'cache'}",
                            f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.load(open(tmp_path / "run" / "summary.json"))
    assert summary["optimizer_steps"] >= 2 and set(summary["before"]) == set(summary["after"]) == {"accuracy", "reward"}
    assert summary["config"]["task"]["name"] == "countdown"
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    # quiet: no library warning on the terminal; Lightning's own lines are in the run's log file
    assert "warn" not in out.stderr.lower() and "GPU available" not in out.stderr + out.stdout
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in (tmp_path / "run" / "train.log").read_text()
