"""Build a policy by name: the registered builder, then the training options (dtype, LoRA, checkpointing).

Every module of this package is imported first (:func:`~diffusion_rl.registry.discover`), so a new
architecture is one file that registers its builder with ``@MODELS.register(name)``.
"""

from __future__ import annotations

import diffusion_rl.models as models_pkg
from diffusion_rl.models.adapters import prepare_for_training
from diffusion_rl.models.policy import MODELS, ModelConfig, PolicyBundle
from diffusion_rl.registry import discover


def discover_models() -> None:
    """Import every model module: registers the builders, and the native architectures with
    ``AutoConfig`` / ``AutoModel`` (so ``AutoModel.from_pretrained`` builds them too)."""
    discover(models_pkg.__name__, models_pkg.__path__)


def build_policy(cfg: ModelConfig) -> PolicyBundle:
    """Build the named model, then apply the training options (LoRA, activation checkpointing)."""
    discover_models()
    cfg.validate()
    bundle = MODELS.get(cfg.name)(cfg)
    bundle.net = prepare_for_training(bundle.net, cfg)
    return bundle
