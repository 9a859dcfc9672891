"""``src/eval.py`` evaluates the run a checkpoint came from (training/restore.py): the checkpoint's
model, tokenizer, task and sampler, explicit overrides on top, a different network refused."""

import json
import os
import shutil
import time

import pytest
from omegaconf import OmegaConf

from diffusion_rl.app.evaluate import evaluate_checkpoint
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.restore import check_architecture, config_from_checkpoint
from tests.unit.tasks.test_text_tasks import compose_eval

RUN_SCHEDULE = "eval.steps_per_token=0.25"  # tests/helpers/common.py's runs: sampler.steps=4 for 16 tokens


def _eval(tmp_path, overrides, out="ev"):
    """``python src/eval.py <overrides>``: the eval config composed from the command line's overrides."""
    return evaluate_checkpoint(compose_eval(overrides, tmp_path), tmp_path / out, overrides=overrides)


def test_eval_of_a_run_folder_scores_what_the_run_reported(tiny_run, tmp_path):
    run, summary = tiny_run
    # eval.yaml's defaults are model=tiny at d_model=128 and 256 test puzzles; the run trained d_model=32
    # and held out 8: both come from the checkpoint, so the score is the run's own "after" exactly (with
    # the protocol's schedule set to the run's: 4 steps for 16 tokens, where the papers' is 8)
    out = _eval(tmp_path, [f"ckpt_path={run}", RUN_SCHEDULE])
    assert out["num_items"] == summary["num_test_items"] == 8
    assert {k: out[k] for k in summary["after"]} == summary["after"]
    assert out["ckpt_path"] == str(run / "checkpoints" / "last.ckpt")


def test_an_override_that_changes_the_network_is_refused_in_one_line(tiny_run, tmp_path):
    run, _ = tiny_run
    size = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2"]
    with pytest.raises(ConfigError) as err:  # same tensors as model=tiny, other attention
        _eval(tmp_path, [f"ckpt_path={run}", "model=tiny_block", *size])
    msg = str(err.value)
    assert msg.startswith("model.block_size=4 is invalid: the checkpoint") and "model.block_size=0" in msg
    with pytest.raises(ConfigError, match=r"^model.n_layers=3 is invalid: .* trained with model.n_layers=2"):
        _eval(tmp_path, [f"ckpt_path={run}", "model.n_layers=3"])
    assert not (tmp_path / "ev").exists()  # refused before anything was written


def test_explicit_overrides_go_on_top_of_the_checkpoints_config(tiny_run, tmp_path):
    run, _ = tiny_run
    csv = tmp_path / "sudoku.csv"
    csv.write_text("Puzzle,Solution\n3102200002100320,3142243142131324\n0000341221434321,1234341221434321\n"
                   "1200340021004300,1234341221434321\n")
    out = _eval(tmp_path, [f"ckpt_path={run}", f"task.data_path={csv}", "model.dtype=float32"])
    assert out["num_items"] == 3 and out["scored"] == f"all 3 items of {csv}"  # the whole file, no cap
    saved = json.loads((tmp_path / "ev" / "eval_summary.json").read_text())
    assert saved["scored"] == out["scored"]


def test_ckpt_path_last_is_the_newest_run_under_outputs(tiny_run, tmp_path, monkeypatch):
    run, summary = tiny_run
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="ckpt_path='last' is invalid: means the newest training run under"):
        _eval(tmp_path, ["ckpt_path=last"])
    for name, age in (("old", 100), ("new", 0)):  # two runs: the newer one is evaluated
        (tmp_path / "outputs" / "runs" / "2026-01-01" / name / "checkpoints").mkdir(parents=True)
        last = tmp_path / "outputs" / "runs" / "2026-01-01" / name / "checkpoints" / "last.ckpt"
        shutil.copy(run / "checkpoints" / "last.ckpt", last)
        os.utime(last, (time.time() - age, time.time() - age))
    out = _eval(tmp_path, ["ckpt_path=last", RUN_SCHEDULE])
    assert out["ckpt_path"] == "outputs/runs/2026-01-01/new/checkpoints/last.ckpt"
    assert {k: out[k] for k in summary["after"]} == summary["after"]


def test_config_from_checkpoint_keeps_a_chosen_group_and_layers_key_overrides():
    cfg = OmegaConf.create({"model": {"name": "tiny", "d_model": 128}, "task": {"name": "countdown", "num_test": None},
                            "sampler": {"steps": 8}, "eval": {"batch_size": 4}})
    stored = {"model": {"name": "tiny", "d_model": 32, "n_layers": 2}, "task": {"name": "sudoku", "num_test": 8},
              "sampler": {"steps": 4, "gen_length": 16}}
    out = config_from_checkpoint(cfg, stored, ["task=countdown", "model.d_model=128", "~sampler.gen_length"])
    assert out.task == cfg.task  # the user chose another task: theirs, whole
    # another test file: the run's cap on its own test set does not apply to it
    cfg.task = {"name": "sudoku", "num_test": None, "data_path": "my.csv"}
    assert config_from_checkpoint(cfg, stored, ["task.data_path=my.csv"]).task.num_test is None
    cfg.task.num_test = 2
    assert config_from_checkpoint(cfg, stored, ["task.data_path=my.csv", "task.num_test=2"]).task.num_test == 2
    assert dict(out.model) == {"name": "tiny", "d_model": 128, "n_layers": 2}  # the run's, with the override on top
    assert dict(out.sampler) == {"steps": 4}
    assert out.eval.batch_size == 4


def test_check_architecture_allows_runtime_keys_only():
    trained = {"name": "tiny", "d_model": 32, "n_layers": 2, "n_heads": 2}
    check_architecture(trained, {**trained, "dtype": "bfloat16", "gradient_checkpointing": True}, "x.ckpt")
    check_architecture({"name": "tiny"}, {"name": "tiny", "d_model": 128}, "x.ckpt")  # 128 is the default
    with pytest.raises(ConfigError, match="model.n_heads=4 is invalid"):
        check_architecture(trained, {**trained, "n_heads": 4}, "x.ckpt")
