"""Config composition for tests (the real conf/ tree, shrunk to seconds on a CPU) and hand-made batches
and rollouts."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from diffusion_rl.app.conf_store import register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"

# A run small enough for the default test tier: a 2-layer d=32 model, 2 prompts x 4 samples.
TINY = [
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
    "task.num_train=64", "task.num_test=8", "task.prompts_per_batch=2", "task.group_size=4",
    "warmstart.steps=3", "warmstart.batch_size=8", "warmstart.reuse=false",
    "sampler.steps=4", "trainer.max_steps=4", "trainer.enable_progress_bar=false",
    "trainer.checkpoint_every_n_steps=2", "eval.batch_size=8",
]


STEP_OBJECTIVES = ("egspo", "egspo_sa", "mdpo")  # objectives that train K of the sampler's steps


def tiny_for(overrides: list[str]) -> list[str]:
    """TINY, plus what an objective needs at its size: EGSPO's and MDPO's public K = 8 trained steps
    exceed the tiny sampler's 4 (the objectives refuse K > sampler.steps), so the tiny runs train 2 of 4."""
    steps = any(o in tuple(f"objective={name}" for name in STEP_OBJECTIVES) for o in overrides)
    return TINY + (["objective.K=2"] if steps else [])


def compose_cfg(overrides: list[str], tmp_path: Path, tiny: bool = True, config_name: str = "config") -> DictConfig:
    """The config ``src/train.py`` runs for these overrides (Hydra's compose, as ``--cfg job`` prints it)."""
    register_configs()
    full = (tiny_for(overrides) if tiny else []) + [f"paths.cache_dir={tmp_path / 'cache'}"] + overrides
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=full)


def rollout_of(prompt, pmask, comp, cmask, rewards, advantages, group_size: int, rollout_id: int = 7, **kw):
    """A :class:`Rollout` of hand-made tensors (no texts or items; rewards of every row known)."""
    from diffusion_rl.rl.batch import Rollout

    n = comp.shape[0]
    return Rollout(rollout_id, group_size, prompt, pmask, comp, cmask, [""] * n, [{}] * n, rewards, rewards, {},
                   advantages, **kw)


def make_batch(bundle, n=8, P=6, L=10, seed=0):
    """Random prompts (left padding on row 0) and completions with an EOS in some rows, for ``bundle``'s
    tokenizer -> prompt, prompt mask, completion, completion mask."""
    import torch

    from diffusion_rl.sampling.sampler import completion_mask

    g = torch.Generator().manual_seed(seed)
    V = bundle.tokenizer.vocab_size
    lo = max(bundle.mask_token_id, bundle.eos_token_id, bundle.pad_token_id) + 1
    prompt = torch.randint(lo, V, (n, P), generator=g)
    pmask = torch.ones(n, P, dtype=torch.long)
    pmask[0, :2] = 0
    prompt[0, :2] = bundle.pad_token_id
    comp = torch.randint(lo, V, (n, L), generator=g)
    comp[1, 4] = bundle.eos_token_id  # rows 1 and 3 end early
    comp[3, 7] = bundle.eos_token_id
    return prompt, pmask, comp, completion_mask(comp, bundle.eos_token_id)


def capture_module(monkeypatch) -> dict:
    """Patch ``app/train.py`` so that the ``DiffusionRLModule`` that ``train`` builds is recorded:
    ``["module"]`` the module, ``["start"]`` a copy of its policy's state dict as built."""
    import diffusion_rl.app.train as train_mod

    captured: dict = {}
    real = train_mod.DiffusionRLModule

    def build_and_record(*args, **kwargs):
        m = real(*args, **kwargs)
        captured["module"], captured["start"] = m, {k: v.clone() for k, v in m.policy.state_dict().items()}
        return m

    monkeypatch.setattr(train_mod, "DiffusionRLModule", build_and_record)
    return captured
