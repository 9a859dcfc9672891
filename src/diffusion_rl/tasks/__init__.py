"""Tasks: data, prompts, rewards and metrics for each benchmark, registered by name."""

from diffusion_rl.tasks.base import TASKS, Task, TaskConfig, TaskDataModule, extract_answer

__all__ = ["TASKS", "Task", "TaskConfig", "TaskDataModule", "extract_answer"]
from diffusion_rl.tasks import countdown, gsm8k, math500, sudoku  # noqa: F401, E402
