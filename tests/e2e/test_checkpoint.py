"""Checkpoints over whole runs: only the newest ``keep_last_k`` step checkpoints stay, and a LoRA checkpoint
resumes only on its own base. The checkpoint files themselves are tested in tests/unit/training/test_checkpoint.py."""

import pytest
import torch

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.checkpoint import RUN_KEY


def test_only_the_newest_keep_last_k_step_checkpoints_are_kept(tmp_path):
    from diffusion_rl.app.train import train
    from tests.helpers.common import compose_cfg

    cfg = compose_cfg(["trainer.max_steps=6", "trainer.checkpoint_every_n_steps=1", "trainer.keep_last_k=2",
                       "eval.before=false", "eval.after=false", "eval.every_n_steps=0"], tmp_path)
    train(cfg, tmp_path / "run")
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step000005.ckpt", "step000006.ckpt"]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert state and all(k.startswith("policy.") for k in state)  # neither the old nor the reference copy


def test_a_lora_checkpoint_resumes_only_on_its_own_base(tmp_path):
    """The frozen base is not in a LoRA checkpoint: it is named by path and content hash, and resuming
    on another base stops in one line; on the same base the run resumes."""
    pytest.importorskip("peft")
    from diffusion_rl.app.train import train
    from tests.helpers.common import compose_cfg
    from tests.helpers.released_layouts import write_checkpoint

    base = write_checkpoint("llada", tmp_path / "base", real_ids=False)
    other = write_checkpoint("llada", tmp_path / "other", real_ids=False, seed=1)
    common = ["model=llada_8b_instruct", "model.dtype=float32", "model.lora_r=4", "objective.mu=1", "task.num_train=64", "task.num_test=4",
              "task.num_val=4", "task.prompts_per_batch=2", "task.group_size=4", "warmstart.enabled=false",
              "eval.before=false", "eval.after=false", "eval.every_n_steps=0", "sampler.gen_length=8",
              "sampler.block_length=8", "sampler.steps=4", "trainer.enable_progress_bar=false",
              "trainer.checkpoint_every_n_steps=1", f"hydra.run.dir={tmp_path / 'run'}"]
    train(compose_cfg([*common, f"model.path={base}", "trainer.max_steps=1"], tmp_path, tiny=False), tmp_path / "run")
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert all("lora_" in k for k in ckpt["state_dict"]) and ckpt[RUN_KEY]["base"]["path"] == str(base.resolve())
    with pytest.raises(ConfigError) as err:
        train(compose_cfg([*common, f"model.path={other}", "trainer.max_steps=2", "ckpt_path=last"], tmp_path,
                          tiny=False), tmp_path / "run")
    assert str(err.value).startswith("ckpt_path=") and "its frozen weights are not in it" in str(err.value)
    resumed = train(compose_cfg([*common, f"model.path={base}", "trainer.max_steps=2", "ckpt_path=last"], tmp_path,
                                tiny=False), tmp_path / "run")
    assert resumed["optimizer_steps"] == 2
