"""Bad config values and unknown names fail at start-up in one line naming the key."""

import subprocess
import sys

import pytest

from diffusion_rl.errors import ConfigError
from diffusion_rl.train import build

from .conftest import ROOT
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


@pytest.mark.parametrize(
    "args,needle",
    [
        (["objective=foo"], "objective='foo' is invalid: unknown objective; allowed: egspo, egspo_sa, grpo, stabledrl"),
        (["task.group_size=1"], "task.group_size=1 is invalid"),
        (["sampler.gen_length=20"], "sampler.gen_length=20 is invalid: must be divisible by sampler.block_length=16"),
    ],
)
def test_cli_prints_one_line_and_exits_2(args, needle):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "src" / "train.py"), *args, "hydra.run.dir=/tmp/_never_used"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
