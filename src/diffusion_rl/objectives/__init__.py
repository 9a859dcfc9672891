"""Policy-gradient objectives, registered by name (one file per objective)."""

from diffusion_rl.objectives import (
    egspo,  # noqa: F401  (registers "egspo", "egspo_sa")
    grpo,  # noqa: F401  (registers "grpo")
    stabledrl,  # noqa: F401  (registers "stabledrl")
)
from diffusion_rl.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveConfig,
    StepContext,
    group_advantages,
)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveConfig", "StepContext", "group_advantages"]
