"""Tasks: data, prompts, rewards and metrics for each benchmark, registered by name (one file each,
found by :func:`discover`)."""

from diffusion_rl.core.registry import discover
from diffusion_rl.tasks.base import TASKS, Task, TaskConfig, TaskDataModule

discover(__name__, __path__)

__all__ = ["TASKS", "Task", "TaskConfig", "TaskDataModule"]
