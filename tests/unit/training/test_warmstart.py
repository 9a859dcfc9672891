"""The warm start's cache key holds what changes its sums: the thread count as much as its config."""

import torch

from diffusion_rl.tasks.sudoku import SudokuConfig, SudokuTask
from diffusion_rl.training.warmstart import WarmStartConfig, numerics, warm_start


def _warm(bundle, folder, threads):
    task = SudokuTask(SudokuConfig(num_train=16, num_test=4))
    task.use_tokenizer(bundle.tokenizer)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return warm_start(bundle, task, 16, WarmStartConfig(steps=1, batch_size=2), {"model": "tiny"}, str(folder),
                          progress=False)
    finally:
        torch.set_num_threads(before)


def test_a_warm_start_trained_on_other_threads_is_not_reused(tiny_bundle, tmp_path):
    one = _warm(tiny_bundle, tmp_path, 1)
    assert not one["reused"] and one["numerics"]["threads"] == 1
    again = _warm(tiny_bundle, tmp_path, 1)
    assert again["reused"] and again["key"] == one["key"]  # same config, same threads: the cached one
    two = _warm(tiny_bundle, tmp_path, 2)
    assert not two["reused"] and two["key"] != one["key"] and two["numerics"]["threads"] == 2
    assert set(numerics()) == {"torch", "threads", "cpu_capability"} and numerics()["torch"] == torch.__version__
