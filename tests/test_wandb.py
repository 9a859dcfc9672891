"""W&B: offline logging without network, the offline fallback, the optional import, the dashboard."""

import importlib.util
import logging
import re
import sys

import pytest

from diffusion_rl.errors import ConfigError
from diffusion_rl.training import loggers as loggers_mod
from diffusion_rl.training.loggers import WandbConfig, make_loggers, make_wandb_logger

from .helpers import CONF, compose_cfg

ROOT = CONF.parent


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Everything W&B writes goes under tmp; no API key anywhere."""
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


def test_wandb_logger_offline_logs_metrics_samples_and_config(wandb_env, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    from wandb.sdk.wandb_run import Run

    from diffusion_rl.train import train

    # wandb's offline store is a binary log only its service reads back: watch what reaches the run
    logged, seen = [], {}
    real_log, real_finish = Run.log, Run.finish

    def log(self, data, *args, **kwargs):
        logged.append(dict(data))
        return real_log(self, data, *args, **kwargs)

    def finish(self, *args, **kwargs):
        seen.update(config=dict(self.config), summary={k: self.summary[k] for k in self.summary.keys()},
                    mode=self.settings.mode, exit_code=kwargs.get("exit_code"))
        return real_finish(self, *args, **kwargs)

    monkeypatch.setattr(Run, "log", log)
    monkeypatch.setattr(Run, "finish", finish)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_cfg(["logger=wandb", "objective=stabledrl", "objective.mu=2", "logger.wandb.tags=[test]",
                       "diagnostics.samples_every_n_steps=2"], wandb_env)
    run = wandb_env / "run"
    summary = train(cfg, run)
    assert (run / "metrics.csv").exists()  # CSV rides along
    rows = [r for r in logged if "grad/norm" in r]
    assert [r["trainer/global_step"] for r in rows] == [1, 2, 3, 4]  # one row per optimizer step
    for key in ("grad/norm_ema", "grad/spike", "grad/spikes_total", "weights/ess", "ratio/log_std", "train/loss"):
        assert all(key in r for r in rows), key
    tables = [r for r in logged if "samples/completions" in r]
    assert [r["trainer/global_step"] for r in tables] == [2, 4]
    table = tables[0]["samples/completions"]
    assert list(table.columns) == ["step", "prompt", "completion", "reward"] and len(table.data) >= 1
    assert seen["config"]["objective"]["name"] == "stabledrl"  # the resolved config
    assert seen["config"]["diagnostics"]["samples_every_n_steps"] == 2
    assert seen["summary"]["eval_after/cell_accuracy"] == pytest.approx(summary["after"]["cell_accuracy"])
    assert seen["mode"] == "offline" and seen["exit_code"] == 0
    [offline] = list((run / "wandb").glob("offline-run-*"))
    assert next(offline.glob("run-*.wandb")).stat().st_size > 0
    assert wandb.run is None  # closed: the next job of a multirun starts its own


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
