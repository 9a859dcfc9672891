"""The run's loggers from ``conf/logger/*.yaml``: CSV (always useful offline), TensorBoard, W&B.

``logger.names`` lists them. W&B (``logger=wandb``) is optional: ``wandb`` is imported only when it
is named, and a missing package stops the run in one line. Its options (``logger.wandb``): project,
entity, group, tags, name (default: the run folder's name), ``offline``. Without an API key
(``WANDB_API_KEY``, a ``.netrc`` entry as ``wandb login`` writes, or ``WANDB_IDENTITY_TOKEN_FILE``)
the run logs offline and says so once per process; ``wandb sync <run>/wandb/offline-run-*`` uploads
it later. The resolved config goes to W&B at ``wandb.init``; the held-out results of the summary go
to the W&B run summary when :func:`finish_loggers` closes it.
"""

from __future__ import annotations

import logging
import netrc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import lightning as L
from omegaconf import DictConfig, OmegaConf

from diffusion_rl.config import from_dict
from diffusion_rl.errors import ConfigError

log = logging.getLogger(__name__)

LOGGERS = ("csv", "tensorboard", "wandb")
_said_offline = False


@dataclass
class WandbConfig:
    project: str = "diffusion-rl"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    name: str | None = None  # default: the run folder's name (a multirun job's overrides)
    offline: bool = False  # true: never upload, even with an API key


@dataclass
class LoggerConfig:
    names: list[str] = field(default_factory=lambda: ["csv"])  # csv | tensorboard | wandb; csv is always useful
    wandb: WandbConfig = field(default_factory=WandbConfig)  # logger=wandb


def make_loggers(cfg: DictConfig, run_dir: Path) -> list:
    lcfg = from_dict(LoggerConfig, cfg.get("logger") or {}, "logger")
    loggers: list[Any] = []
    for name in lcfg.names:
        if name == "csv":
            loggers.append(L.pytorch.loggers.CSVLogger(run_dir, name="", version=""))
        elif name == "tensorboard":
            loggers.append(L.pytorch.loggers.TensorBoardLogger(run_dir, name="tb", version=""))
        elif name == "wandb":
            loggers.append(make_wandb_logger(lcfg.wandb, run_dir, OmegaConf.to_container(cfg, resolve=True)))
        else:
            raise ConfigError("logger.names", name, f"allowed: {', '.join(LOGGERS)}")
    return loggers


def make_wandb_logger(wcfg: WandbConfig, run_dir: Path, config: Any = None):
    try:
        import wandb
    except ImportError:
        raise ConfigError("logger.names", "wandb",
                          "the wandb package is not installed: pip install 'diffusion-rl[wandb]'") from None
    if wandb.run is not None:  # left open by a job that failed outside fit (same multirun process)
        wandb.finish(exit_code=1)
    offline = wcfg.offline or os.environ.get("WANDB_MODE", "") in ("offline", "dryrun")
    if not offline and os.environ.get("WANDB_MODE") != "disabled" and not has_wandb_credentials():
        offline = True
        global _said_offline
        if not _said_offline:
            _said_offline = True
            log.warning("W&B: no API key configured (WANDB_API_KEY or `wandb login`); logging offline under "
                        "<run>/wandb, upload later with `wandb sync`")
    # mode= goes to wandb.init for this run only; Lightning's offline=True would set WANDB_MODE for the
    # whole process (every later job of a multirun).
    kwargs: dict[str, Any] = {"mode": "offline"} if offline else {}
    return L.pytorch.loggers.WandbLogger(
        name=wcfg.name or Path(run_dir).name, save_dir=str(run_dir), project=wcfg.project, entity=wcfg.entity,
        group=wcfg.group, tags=list(wcfg.tags) or None, config=config, **kwargs,
    )


def has_wandb_credentials() -> bool:
    """An API key is configured: environment, identity token, or a .netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def finish_loggers(loggers: list, summary: dict[str, Any] | None = None, failed: bool = False) -> None:
    """Close W&B runs (the next job of a multirun must not reuse them), with the held-out results."""
    for logger in loggers:
        if type(logger).__name__ != "WandbLogger" or getattr(logger, "_experiment", None) is None:
            continue
        run = logger.experiment
        if summary:
            for phase in ("before", "after"):
                for k, v in (summary.get(phase) or {}).items():
                    run.summary[f"eval_{phase}/{k}"] = v
            run.summary["skipped_updates"] = summary.get("skipped_updates")
            for k, v in (summary.get("grad") or {}).items():
                run.summary[f"grad_summary/{k}"] = v
        run.finish(exit_code=1 if failed else 0)
        logger._experiment = None
