"""W&B: the offline fallback, the optional import, the dashboard, a resume's named continuation. Whole
runs (offline logging, resumed runs' W&B and TensorBoard curves): tests/e2e/test_wandb.py."""

import importlib.util
import logging
import re
import sys

import pytest

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training import loggers as loggers_mod
from diffusion_rl.training.loggers import ResumePoint, WandbConfig, make_loggers, make_wandb_logger
from tests.helpers.common import CONF, compose_cfg

ROOT = CONF.parent


def test_a_wandb_logger_is_told_by_its_class(wandb_env):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import CSVLogger

    class NotWandbLogger(CSVLogger):  # the name alone no longer makes a W&B logger
        pass

    ours = loggers_mod._wandb_logger_class()(offline=True, save_dir=str(wandb_env))  # no run until first use
    assert loggers_mod._is_wandb(ours)
    assert not loggers_mod._is_wandb(NotWandbLogger(wandb_env)) and not loggers_mod._is_wandb(CSVLogger(wandb_env))
    assert loggers_mod.wandb_run_id([ours, CSVLogger(wandb_env)]) is None  # never started: no id


def test_without_api_key_it_goes_offline_and_says_so_once(wandb_env, monkeypatch, caplog):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.training.loggers"):
        a = make_wandb_logger(WandbConfig(), wandb_env / "a")
        b = make_wandb_logger(WandbConfig(), wandb_env / "b")
    assert a._wandb_init["mode"] == b._wandb_init["mode"] == "offline"
    assert a._wandb_init["name"] == "a" and a._wandb_init["project"] == "diffusion-rl"
    said = [r for r in caplog.records if "no API key" in r.getMessage()]
    assert len(said) == 1


def test_with_an_api_key_it_stays_online_unless_offline_is_set(wandb_env, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    (wandb_env / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    (wandb_env / "netrc").chmod(0o600)
    assert loggers_mod.has_wandb_credentials()
    online = make_wandb_logger(WandbConfig(group="g", tags=["x"]), wandb_env / "r")
    assert "mode" not in online._wandb_init and online._wandb_init["group"] == "g"
    assert make_wandb_logger(WandbConfig(offline=True), wandb_env / "r")._wandb_init["mode"] == "offline"


def test_missing_wandb_package_is_a_one_line_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"wandb package is not installed: pip install"):
        make_loggers(compose_cfg(["logger=wandb"], tmp_path), tmp_path)


def _documented_panels():
    """(section, panel, metrics) rows of the table in docs/dashboard.md."""
    rows = []
    for line in (ROOT / "docs" / "dashboard.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("section", "---"):
            rows.append((cells[0], cells[1], re.findall(r"`([^`]+)`", cells[2])))
    return rows


def test_dashboard_workspace_has_the_documented_panels():
    pytest.importorskip("wandb_workspaces")
    spec = importlib.util.spec_from_file_location("wandb_dashboard", ROOT / "scripts" / "wandb_dashboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ws = mod.build_workspace("entity", "project")
    built = []
    for section in ws.sections:
        for p in section.panels:
            if type(p).__name__ == "LinePlot":
                assert p.x == "trainer/global_step"
                built.append((section.name, p.title, list(p.y)))
            else:
                built.append((section.name, "sample completions", [p.table_name]))
    assert built == _documented_panels()
    assert ws.settings.x_axis == "trainer/global_step" and ws.settings.smoothing_weight == 0
    gn = ws.sections[0].panels[0]
    assert gn.y == ["grad/norm", "grad/norm_ema"] and gn.log_y
    view = ws._to_model()  # serialises without any network call
    assert view.project == "project"


# ---- a resumed run continues its dashboards ------------------------------------------------------


def test_without_rewind_support_a_resume_logs_to_a_named_continuation(wandb_env, monkeypatch):
    pytest.importorskip("wandb")
    import wandb

    real_init = wandb.init

    def old_init(project=None, name=None, **kwargs):  # a wandb before 0.17.1: no resume_from
        return real_init(project=project, name=name, **kwargs)

    monkeypatch.setattr(wandb, "init", old_init)
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = make_wandb_logger(WandbConfig(), wandb_env / "r", {"seed": 0}, ResumePoint(step=40, wandb_id="abc123"))
    assert logger._wandb_init["name"] == "r-resumed-step40" and "resume_from" not in logger._wandb_init
    assert logger._wandb_init["config"]["resumed_from"] == {"run_id": "abc123", "step": 40}


def test_logger_packages_missing_is_a_one_line_config_error(tmp_path, monkeypatch):
    for name in ("tensorboard", "tensorboardX"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError, match=r"logger.names='tensorboard' is invalid: the tensorboard package is not installed"):
        make_loggers(compose_cfg(["logger=tensorboard"], tmp_path), tmp_path)
