"""Shared test setup: no hub calls, small thread count, a tiny model fixture."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from diffusion_rl.app.conf_store import register_configs  # noqa: E402

register_configs()  # the base_* nodes every conf/ yaml starts from

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
FIXTURES = ROOT / "tests" / "fixtures"  # public benchmark files the tests read (fixtures/README.md)


@pytest.fixture(scope="session")
def d1_generations(tmp_path_factory) -> Path:
    """d1's released LLaDA generations (85 JSON files), unpacked from the fixture archive."""
    import tarfile

    out = tmp_path_factory.mktemp("d1")
    with tarfile.open(FIXTURES / "d1_llada_eval" / "d1_llada_eval.tar.xz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(out, filter="data")
        else:
            tar.extractall(out)  # noqa: S202 (our own archive)
    return out / "d1_llada_eval"


@pytest.fixture
def tiny_bundle():
    import torch

    from diffusion_rl.models.build import build_policy
    from diffusion_rl.models.policy import ModelConfig

    torch.manual_seed(0)
    return build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))


@pytest.fixture
def block_bundle():
    """A tiny block diffusion model (block size ``tests.helpers.blocks.BS``), in eval mode."""
    import torch

    from diffusion_rl.models.build import build_policy
    from diffusion_rl.models.policy import ModelConfig
    from tests.helpers.blocks import BS

    torch.manual_seed(0)
    b = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2, block_size=BS))
    b.net.eval()
    return b


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint and character tokenizer for ``model=hf`` (tests/helpers/tiny_hf.py)."""
    from tests.helpers.tiny_hf import save_tiny_hf

    return save_tiny_hf(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny training run shared by the tests that need a real run folder (checkpoints, eval,
    report, bad input): 5 optimizer steps, a checkpoint every 2 (so the last step is not one of
    them), held-out evaluation every 2 steps. Returns ``(run folder, summary)``; read-only for users."""
    from diffusion_rl.app.train import train
    from tests.helpers.common import compose_cfg

    tmp = tmp_path_factory.mktemp("tiny_run")
    cfg = compose_cfg(["trainer.max_steps=5", "trainer.checkpoint_every_n_steps=2", "eval.every_n_steps=2"], tmp)
    summary = train(cfg, tmp / "run")
    (tmp / "run" / ".hydra").mkdir()  # what Hydra writes into a run folder, for src/report.py
    (tmp / "run" / ".hydra" / "overrides.yaml").write_text("- trainer.max_steps=5\n")
    return tmp / "run", summary


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Everything W&B writes goes under tmp; no API key anywhere."""
    from diffusion_rl.training import loggers as loggers_mod

    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        (tmp_path / var.lower()).mkdir()
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setattr(loggers_mod, "_said_offline", False)
    return tmp_path
