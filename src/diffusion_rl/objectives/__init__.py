"""Policy-gradient objectives, registered by name (one file per objective)."""

from diffusion_rl.objectives import grpo  # noqa: F401  (registers "grpo")
from diffusion_rl.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveConfig,
    StepContext,
    group_advantages,
)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveConfig", "StepContext", "group_advantages"]
