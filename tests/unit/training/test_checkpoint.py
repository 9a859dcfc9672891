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


def test_the_checkpoint_callback_keeps_what_trains_and_puts_the_rest_back(tmp_path):
    """RunCheckpoint alone, on a module with a frozen old-policy copy: the copy stays out of the
    checkpoint and equals the policy again after loading; a tensor the module lacks is refused."""
    from types import SimpleNamespace

    from diffusion_rl.app.train import build
    from diffusion_rl.training.checkpoint import RunCheckpoint, RunRecord, frozen_names
    from diffusion_rl.training.module import DiffusionRLModule
    from tests.helpers.common import compose_cfg

    c = build(compose_cfg([], tmp_path))
    module = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0, old_policy="copy")
    assert module.old_policy is not None
    module.rollout_count, module.skipped_updates, module.consecutive_skips = 7, 2, 1
    cb, trainer = RunCheckpoint(RunRecord(config={"seed": 0}, warm_start={"key": "w"})), SimpleNamespace(loggers=[])
    checkpoint = {"state_dict": {k: v.clone() for k, v in module.state_dict().items()}}
    cb.on_save_checkpoint(trainer, module, checkpoint)
    frozen = frozen_names(module)
    assert any(k.startswith("old_policy.") for k in frozen) and not set(frozen) & set(checkpoint["state_dict"])
    state = checkpoint["rl_state"]
    assert (state["rollout_count"], state["skipped_updates"], state["consecutive_skips"]) == (7, 2, 1)
    assert checkpoint[RUN_KEY] == {"config": {"seed": 0}, "wandb_id": None, "base": None}

    fresh = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0, old_policy="copy")
    for k, v in checkpoint["state_dict"].items():
        if k.startswith("policy.") and v.is_floating_point():
            v.add_(1.0)  # the checkpoint's policy trained away from the weights the module was built with
    fresh.load_state_dict(checkpoint["state_dict"], strict=fresh.strict_loading)  # as Lightning does
    cb.on_load_checkpoint(trainer, fresh, checkpoint)
    policy, old = fresh.policy.state_dict(), fresh.old_policy.state_dict()
    assert all(torch.equal(policy[k], old[k]) for k in policy)
    assert (fresh.rollout_count, fresh.skipped_updates, fresh.consecutive_skips) == (7, 2, 1)
    checkpoint["state_dict"]["policy.not_a_tensor_of_it"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="Unexpected key.*policy.not_a_tensor_of_it"):
        cb.on_load_checkpoint(trainer, fresh, checkpoint)
