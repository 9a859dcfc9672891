"""DiffusionGemma under ``trainer=fsdp`` (FSDP2) on two gloo processes equals one process: every step's
loss, reward and gradient norm, and the updated weights. Each encoder layer and its decoder twin share
their weights (experts and router included), so the two are one FSDP2 unit (``training/strategy.py``'s
``sharing_groups``); a rollout replays its recorded steps through the sharded network."""

from __future__ import annotations

import pytest

from tests.e2e.test_fsdp import two_processes_equal_one

GEMMA_RUN = ["model=diffusion_gemma_tiny", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
             "old_policy=precomputed", "task.num_train=64", "task.num_test=8", "task.num_val=8",
             "task.prompts_per_batch=2", "task.group_size=4", "warmstart.enabled=false", "sampler.gen_length=16",
             "sampler.uniform.steps=4", "trainer.max_steps=3", "trainer.enable_progress_bar=false",
             "trainer.checkpoint_every_n_steps=2", "eval.batch_size=8", "eval.every_n_steps=0",
             "trainer.accelerator=cpu", "diagnostics.samples_every_n_steps=0"]


@pytest.mark.slow
@pytest.mark.parametrize("objective", [["objective=tracerl"], ["objective=grpo", "likelihood=uniform_elbo"]],
                         ids=["tracerl", "grpo-uniform_elbo"])
def test_two_process_fsdp_equals_one_process_for_diffusion_gemma(tmp_path, objective):
    two_processes_equal_one([*GEMMA_RUN, *objective], tmp_path)
