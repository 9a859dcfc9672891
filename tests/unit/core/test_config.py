"""Bad config values and unknown names fail at start-up in one line naming the key."""

import pytest

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from tests.helpers.common import compose_cfg


@pytest.mark.parametrize(
    "override,key",
    [
        ("objective.eps=-1", "objective.eps"),
        ("objective.mu=0", "objective.mu"),
        ("task.group_size=1", "task.group_size"),
        ("sampler.gen_length=20", "sampler.gen_length"),  # not divisible by block_length=16
        ("objective.name=foo", "objective.name"),
        ("+objective.bogus=1", "objective.bogus"),
        ("optim.lr=abc", "optim.lr"),
        ("likelihood.p_mask_prompt=1.5", "likelihood.p_mask_prompt"),
        ("model.n_heads=3", "model.d_model"),
    ],
)
def test_bad_values_raise_config_error_naming_key(tmp_path, override, key):
    cfg = compose_cfg([override], tmp_path)
    with pytest.raises(ConfigError) as err:
        build(cfg)
    msg = str(err.value)
    assert msg.startswith(key + "=")
    assert "\n" not in msg


# the command-line path (src/train.py ... -> exit 2, one line) is tests/e2e/test_cli.py's table (docs/cli_errors.md)


def trainer_of(tmp_path, **kw):
    """``make_trainer`` on a TrainerConfig (the only part of the components it reads)."""
    from types import SimpleNamespace

    from diffusion_rl.app.train import TrainerConfig, make_trainer

    return make_trainer(SimpleNamespace(trainer=TrainerConfig(**kw)), tmp_path, [], [])  # type: ignore[arg-type]


@pytest.mark.parametrize("kw,key", [
    ({"precision": "bf17"}, "trainer.precision"),  # Lightning's ValueError
    ({"devices": "abc"}, "trainer.devices"),  # its TypeError
    ({"accelerator": "cuda_or_nothing"}, "trainer.accelerator"),  # its MisconfigurationException / ValueError
    ({"extra": {"no_such_argument": 1}}, "trainer.extra"),  # an unknown keyword, refused inside Lightning
])
def test_a_value_lightning_rejects_is_a_config_error(tmp_path, kw, key):
    with pytest.raises(ConfigError, match="rejected by Lightning") as err:
        trainer_of(tmp_path, **kw)
    assert str(err.value).startswith(key + "=") and "\n" not in str(err.value)


def test_other_trainer_errors_propagate(tmp_path, monkeypatch):
    import diffusion_rl.app.train as train_mod

    # our own ConfigError keeps its key (it is a ValueError, but not Lightning's)
    with pytest.raises(ConfigError, match=r"^trainer\.strategy='nope' is invalid: with strategy_kwargs allowed"):
        trainer_of(tmp_path, strategy="nope", strategy_kwargs={"x": 1})

    def broken(*args, **kwargs):  # errors raised outside Lightning's argument checks, whatever they say
        raise kind("CUDA error: devices busy; precision unknown")

    monkeypatch.setattr(train_mod.L, "Trainer", broken)
    for kind in (RuntimeError, ValueError, TypeError):
        with pytest.raises(kind, match="devices busy") as err:
            trainer_of(tmp_path)
        assert type(err.value) is kind  # not a ConfigError (itself a ValueError)
