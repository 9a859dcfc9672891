"""Policy-gradient objectives, registered by name: one file per objective, found by :func:`discover`."""

from diffusion_rl.core.registry import discover
from diffusion_rl.rl.objectives.base import OBJECTIVES, Objective, StepContext
from diffusion_rl.rl.objectives.config import ObjectiveConfig

discover(__name__, __path__)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveConfig", "StepContext"]
