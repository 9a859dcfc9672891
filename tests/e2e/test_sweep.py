"""Sweeps: the ablation experiment composes every arm, a failed job does not stop the others."""

import json
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from diffusion_rl.app.sweep import run_job
from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.report.build import build_report
from tests.helpers.common import CONF, TINY, compose_cfg

ROOT = CONF.parent


def test_run_job_records_a_failure_and_goes_on_only_in_a_multirun(tmp_path):
    def boom():
        raise RuntimeError("bad sweep point")

    assert run_job(boom, tmp_path / "job", multirun=True) is None
    failure = json.loads((tmp_path / "job" / "failed.json").read_text())
    assert failure["type"] == "RuntimeError" and failure["error"] == "bad sweep point"
    assert "boom" in failure["traceback"]
    with pytest.raises(RuntimeError):  # a single run stops, and its folder says why
        run_job(boom, tmp_path / "single", multirun=False)
    assert json.loads((tmp_path / "single" / "failed.json").read_text())["error"] == "bad sweep point"
    assert run_job(lambda: {"after": {}}, tmp_path / "ok", multirun=True) == {"after": {}}


def test_a_config_error_leaves_no_run_folder_unless_the_run_had_one(tmp_path):
    def bad_value():
        raise ConfigError("seed", "abc", "must be an integer")

    fresh = tmp_path / "fresh"  # what Hydra creates before the job: .hydra/ and the job's log
    (fresh / ".hydra").mkdir(parents=True)
    (fresh / ".hydra" / "config.yaml").write_text("seed: abc\n")
    (fresh / "train.log").write_text("")
    with pytest.raises(ConfigError):
        run_job(bad_value, fresh, multirun=False)
    assert not fresh.exists()
    resumed = tmp_path / "resumed"  # a run folder with a checkpoint: kept, and says why this attempt failed
    (resumed / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError):
        run_job(bad_value, resumed, multirun=False)
    assert (resumed / "checkpoints").is_dir() and (resumed / "failed.json").is_file()
    (fresh / ".hydra").mkdir(parents=True)  # a multirun job keeps its folder: the sweep's record
    assert run_job(bad_value, fresh, multirun=True) is None
    assert json.loads((fresh / "failed.json").read_text())["type"] == "ConfigError"


@pytest.mark.parametrize("arm,expected", [
    ("grpo_elbo", {"eps": 100.0, "clip": "ppo", "normalize": "group_size"}),
    ("clip_only", {"eps": 100.0, "clip": "cap", "normalize": "group_size"}),
    ("selfnorm_only", {"clip": "none", "normalize": "self"}),
    ("stabledrl", {"eps": 100.0, "clip": "cap", "normalize": "self"}),
])
def test_ablation_arms_compose_and_build(tmp_path, arm, expected):
    cfg = compose_cfg(["experiment=stabledrl_ablation", f"ablation={arm}", "eps=100"], tmp_path)
    c = build(cfg)
    assert c.objective.cfg.name == "stabledrl"  # one loss; the arms differ in how they clip and normalise
    # the public code's regime whatever the testbed says: SPG's masks and bound, fresh masks, 2 updates,
    # no KL, r - mean
    assert c.objective.likelihood.cfg.name == "spg_blocks" and c.objective.surrogate == "spg_mix"
    assert (c.objective.cfg.mu, c.objective.cfg.share_masks_with_old) == (2, False)
    assert (c.objective.cfg.beta, c.advantage.cfg.name) == (0.0, "group")
    for k, v in expected.items():
        assert getattr(c.objective.cfg, k) == v, k


def test_ablation_experiment_sweeps_the_grid():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=stabledrl_ablation"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert set(params["ablation"].split(",")) == {"grpo_elbo", "clip_only", "selfnorm_only", "stabledrl"}
    assert len(params["seed"].split(",")) >= 5  # paired: every seed of every arm starts from one warm start
    assert cfg.warmstart.seed == 0 and cfg.hydra.launcher.n_jobs == 2


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/joblib' is validated against ConfigStore schema")
def test_joblib_launcher_option_has_two_workers():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=joblib"], return_hydra_config=True)
    assert cfg.hydra.launcher.n_jobs == 2


def _multirun(tmp_path, args, timeout=600):
    cmd = [sys.executable, str(ROOT / "src" / "train.py"), "-m", *TINY, *args,
           f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=${hydra.job.num}",
           f"paths.cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)


def test_a_failed_job_does_not_stop_the_sweep(tmp_path):
    out = _multirun(tmp_path, ["objective=stabledrl", "objective.eps=-1,5"])  # job 0 is invalid
    assert out.returncode == 0, out.stderr[-3000:]
    failed = json.loads((tmp_path / "sweep" / "0" / "failed.json").read_text())
    assert failed["type"] == "ConfigError" and "objective.eps" in failed["error"]
    summary = json.loads((tmp_path / "sweep" / "1" / "summary.json").read_text())
    assert summary["optimizer_steps"] == 4
    report, runs = build_report(tmp_path / "sweep")
    assert [(r.label, r.failed) for r in runs] == [("eps=-1", True), ("eps=5", False)]
    assert "failed: ConfigError" in report.read_text()


@pytest.mark.slow
def test_the_documented_eps_sweep_runs_as_written(tmp_path):
    out = _multirun(tmp_path, ["objective=stabledrl", "objective.eps=5,100,1000", "task=sudoku"])
    assert out.returncode == 0, out.stderr[-3000:]
    _, runs = build_report(tmp_path / "sweep")
    assert [r.label for r in runs] == ["eps=5", "eps=100", "eps=1000"]
    assert not any(r.failed for r in runs)


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_and_survives_a_failure(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = _multirun(tmp_path, ["hydra/launcher=joblib", "objective=stabledrl", "objective.eps=5,-1"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "sweep" / "0" / "summary.json").exists()
    assert (tmp_path / "sweep" / "1" / "failed.json").exists()


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/joblib' is validated against ConfigStore schema")
def test_a_rollout_worker_process_starts_inside_a_joblib_job(tmp_path):
    """The jobs of ``experiment=staleness`` run in joblib's (loky) worker processes, whose start method a
    fresh interpreter does not know: the rollout worker must start there all the same."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = _multirun(tmp_path, ["hydra/launcher=joblib", "rollout.staleness=1,2", "trainer.max_steps=2",
                               "eval.before=false", "eval.after=false"])
    assert out.returncode == 0, out.stderr[-3000:]
    for job in (0, 1):
        assert not (tmp_path / "sweep" / str(job) / "failed.json").exists(), out.stderr[-3000:]
        assert json.loads((tmp_path / "sweep" / str(job) / "summary.json").read_text())["optimizer_steps"] == 2


def test_noise_grid_composes_every_arm_in_the_papers_elbo_regime(tmp_path):
    from hydra import compose, initialize_config_dir

    from diffusion_rl.app.train import build
    from tests.helpers.common import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        full = compose(config_name="config", overrides=["experiment=stabledrl_noise"], return_hydra_config=True)
    params = full.hydra.sweeper.params
    arms = params["ablation"].split(",")
    assert params["objective.share_masks_with_old"] == "true,false" and len(params["seed"].split(",")) == 3
    eps = {}
    for arm in arms:
        c = build(compose_cfg(["experiment=stabledrl_noise", f"ablation={arm}", "objective.share_masks_with_old=false"],
                              tmp_path))
        lik = c.objective.likelihood.cfg
        assert (lik.weighting, lik.t_min, lik.num_samples, c.objective.cfg.mu) == ("inverse_t", 0.001, 2, 2)
        assert c.optim.grad_clip == 0 and c.objective.cfg.share_masks_with_old is False
        eps[arm] = c.objective.cfg.eps
    assert eps == {"grpo_elbo": 5.0, "clip_only": 5.0, "selfnorm_only": 5.0, "stabledrl": 5.0, "stabledrl_eps1000": 1000.0}


def test_target_experiment_is_the_default_job_over_five_seeds(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        full = compose(config_name="config", overrides=["experiment=sudoku_target"], return_hydra_config=True)
    assert len(full.hydra.sweeper.params["seed"].split(",")) >= 5 and full.hydra.launcher.n_jobs == 2
    c = build(compose_cfg(["experiment=sudoku_target"], tmp_path, tiny=False))
    default = build(compose_cfg(["objective=grpo", "task=sudoku"], tmp_path / "default", tiny=False))
    assert (c.advantage.cfg.name, c.advantage.cfg.credit, c.objective.cfg.beta) == ("group", "token", 0.002)
    assert c.run.warmstart.steps == 200 and c.trainer.max_steps == 500
    # the default job, but for how the jobs share the machine
    assert (c.objective.cfg, c.advantage.cfg, c.sampler, c.optim, c.run.warmstart, c.trainer.max_steps) == (
        default.objective.cfg, default.advantage.cfg, default.sampler, default.optim, default.run.warmstart,
        default.trainer.max_steps)
    assert (c.trainer.threads, default.trainer.threads) == (1, 0)


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/joblib' is validated against ConfigStore schema")
def test_each_job_of_a_sweep_runs_its_own_testbed_and_keeps_its_config(tmp_path):
    """Under the joblib launcher (jobs in worker processes): GRPO's job on Sudoku runs its testbed's per-cell
    credit, StableDRL's its own advantage; each job's summary keeps the config its .hydra/config.yaml holds
    and names the testbed file that set the credit."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    out = _multirun(tmp_path, ["hydra/launcher=joblib", "objective=grpo,stabledrl", "trainer.max_steps=1"])
    assert out.returncode == 0, out.stderr[-3000:]
    for job, objective, credit in (("0", "grpo", "token"), ("1", "stabledrl", "sequence")):
        folder = tmp_path / "sweep" / job
        cfg = OmegaConf.load(folder / ".hydra" / "config.yaml")
        summary = json.loads((folder / "summary.json").read_text())
        assert (cfg.objective.name, cfg.advantage.credit) == (objective, credit)
        assert summary["optimizer_steps"] == 1 and summary["config"] == OmegaConf.to_container(cfg, resolve=True)
    variant = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())["config_sources"]["variant"]
    assert variant["conf/testbed/tiny_grpo_sudoku.yaml"]["advantage.credit"] == "token"
    assert "conf/testbed/tiny_grpo_sudoku.yaml: advantage.credit='token'" in \
        (tmp_path / "sweep" / "0" / "train.log").read_text()
