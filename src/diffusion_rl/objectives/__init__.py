"""Policy-gradient objectives, registered by name: one file per objective, found by :func:`discover`."""

from diffusion_rl.objectives.base import OBJECTIVES, Objective, ObjectiveConfig, StepContext
from diffusion_rl.registry import discover

discover(__name__, __path__)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveConfig", "StepContext"]
