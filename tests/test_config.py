"""Bad config values and unknown names fail at start-up in one line naming the key."""

import pytest

from diffusion_rl.errors import ConfigError
from diffusion_rl.train import build

from .helpers import compose_cfg


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


# the command-line path (src/train.py ... -> exit 2, one line) is tests/test_cli.py's table (docs/cli_errors.md)
