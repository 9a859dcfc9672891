"""Shared test setup: no hub calls, small thread count, a tiny model fixture."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from diffusion_rl.conf_store import register_configs  # noqa: E402

register_configs()  # the base_* nodes every conf/ yaml starts from

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = Path(os.environ.get("DIFFUSION_RL_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture
def tiny_bundle():
    import torch

    from diffusion_rl.models.build import build_policy
    from diffusion_rl.models.policy import ModelConfig

    torch.manual_seed(0)
    return build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))
