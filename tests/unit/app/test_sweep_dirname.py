"""A sweep job's folder name fits a file name whatever the command line (app/conf_store.py: short_dirname)."""

from omegaconf import OmegaConf

from diffusion_rl.app.conf_store import MAX_DIRNAME, register_configs, short_dirname
from tests.conftest import CONF

LONG = ("eval.after=False,eval.before=False,eval.every_n_steps=0,experiment=long_stabledrl_eps,likelihood.t_min=0.001,"
        "likelihood.weighting=inverse_t,likelihood=elbo,objective.surrogate=elbo,trainer.max_steps=20,objective.eps=")


def test_a_short_name_is_kept_and_a_long_one_is_cut_with_a_hash_of_the_whole():
    assert short_dirname("objective.eps=5,seed=0") == "objective.eps=5,seed=0"
    assert short_dirname("x" * MAX_DIRNAME) == "x" * MAX_DIRNAME
    names = [short_dirname(LONG + eps) for eps in ("5", "100", "1000")]
    assert all(len(n) == MAX_DIRNAME and n.startswith(LONG[:100]) for n in names)
    assert len(set(names)) == 3  # names that differ only past the cut still differ
    assert short_dirname(LONG + "100") == names[1]  # the same overrides, the same folder


def test_the_sweep_subdir_goes_through_it():
    register_configs()
    hydra = OmegaConf.load(CONF / "config.yaml").hydra
    hydra.job.num, hydra.job.override_dirname = 2, LONG + "1000"
    subdir = hydra.sweep.subdir  # resolved on access
    assert subdir == "2_" + short_dirname(LONG + "1000") and len(subdir) < 255
