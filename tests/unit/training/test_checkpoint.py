"""Checkpoints hold what a user expects: ``last.ckpt`` is the final model, every checkpoint carries its
run's config, a file that is not a checkpoint is refused in one line (training/checkpoint.py). Pruning
and LoRA resumes over whole runs: tests/e2e/test_checkpoint.py."""

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.checkpoint import RUN_KEY, load_checkpoint, resolve_checkpoint


def test_last_ckpt_is_the_final_model_when_max_steps_is_not_a_multiple_of_the_interval(tiny_run):
    run, summary = tiny_run
    assert summary["optimizer_steps"] == 5
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step000002.ckpt", "step000004.ckpt"]
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    step4 = torch.load(run / "checkpoints" / "step000004.ckpt", weights_only=True)
    assert last["global_step"] == 5  # Lightning alone leaves step 4 here
    assert any(not torch.equal(v, step4["state_dict"][k]) for k, v in last["state_dict"].items() if k.startswith("policy."))
    assert resolve_checkpoint(str(run), run).global_step == 5


def test_every_checkpoint_carries_the_resolved_run_config(tiny_run):
    run, summary = tiny_run
    for name in ("last.ckpt", "step000002.ckpt"):
        meta = resolve_checkpoint(str(run / "checkpoints" / name), run).run
        assert meta["config"] == summary["config"]  # model, tokenizer and task as the run resolved them
        assert meta["config"]["model"]["d_model"] == 32 and meta["config"]["task"]["num_test"] == 8
        assert meta["wandb_id"] is None  # no W&B logger in this run
    path, blob = load_checkpoint(run)
    assert path.name == "last.ckpt" and blob[RUN_KEY]["config"]["task"]["name"] == "sudoku"


def test_a_text_file_given_as_checkpoint_is_refused_in_plain_words(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my experiment notes\n")
    for load in (lambda: resolve_checkpoint(str(notes), tmp_path), lambda: load_checkpoint(notes)):
        with pytest.raises(ConfigError) as err:
            load()
        msg = str(err.value)
        assert msg.startswith(f"ckpt_path='{notes}' is invalid: refused {notes}: not a PyTorch checkpoint")
        assert "\n" not in msg and "mmap" not in msg and "zipfile" not in msg  # no torch-internal wording
