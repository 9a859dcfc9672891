"""The run's loggers from ``conf/logger/*.yaml``: CSV (always useful offline), TensorBoard, W&B.

``logger.names`` lists them. W&B (``logger=wandb``) is optional: ``wandb`` is imported only when it
is named, and a missing package stops the run in one line. Its options (``logger.wandb``): project,
entity, group, tags, name (default: the run folder's name), ``offline``. Without an API key
(``WANDB_API_KEY``, a ``.netrc`` entry as ``wandb login`` writes, or ``WANDB_IDENTITY_TOKEN_FILE``)
the run logs offline and says so once per process; ``wandb sync <run>/wandb/offline-run-*`` uploads
it later. The resolved config goes to W&B at ``wandb.init``; the held-out results of the summary go
to the W&B run summary when :func:`finish_loggers` closes it. W&B's own step is the optimizer step
(``trainer/global_step``), so a history row is a step.

A resumed run continues its dashboards where its checkpoint was written (:class:`ResumePoint`): the
CSV keeps its rows up to the checkpoint (``checkpoint.continue_csv_log``); TensorBoard purges the
events after it (``purge_step``); W&B continues the same run (its id rides in the checkpoint)
rewound to the checkpoint's step (``wandb.init(resume_from="<id>?_step=<step>")``, recorded in an
offline run and applied when it is synced). A ``wandb`` without ``resume_from`` (before 0.17.1), or a
server that refuses the rewind, gets a new run named ``<name>-resumed-step<N>`` that says which run
and step it continues (config ``resumed_from``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import netrc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import lightning as L
from omegaconf import DictConfig, OmegaConf

from diffusion_rl.core.config import from_dict
from diffusion_rl.core.errors import ConfigError

log = logging.getLogger(__name__)

LOGGERS = ("csv", "tensorboard", "wandb")
OFFLINE_FLUSH_S = 2.0  # seconds between writes of an offline W&B run's file (wandb's default: 15)
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


@dataclass
class ResumePoint:
    """Where a resumed run's dashboards continue: the checkpoint's optimizer step and the W&B run
    it logged to (``None``: it had none)."""

    step: int
    wandb_id: str | None = None


def check_loggers(cfg: DictConfig) -> LoggerConfig:
    """The validated ``logger`` group; a logger whose package is missing is a one-line error."""
    lcfg = from_dict(LoggerConfig, cfg.get("logger") or {}, "logger")
    for name in lcfg.names:
        if name not in LOGGERS:
            raise ConfigError("logger.names", name, f"allowed: {', '.join(LOGGERS)}")
        if name == "tensorboard" and not (_importable("tensorboard") or _importable("tensorboardX")):
            raise ConfigError("logger.names", name,
                              "the tensorboard package is not installed: pip install 'diffusion-rl[tensorboard]'")
        if name == "wandb" and not _importable("wandb"):
            raise ConfigError("logger.names", name,
                              "the wandb package is not installed: pip install 'diffusion-rl[wandb]'")
    return lcfg


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def make_loggers(cfg: DictConfig, run_dir: Path, resume: ResumePoint | None = None) -> list:
    lcfg = check_loggers(cfg)
    loggers: list[Any] = []
    for name in lcfg.names:
        if name == "csv":
            loggers.append(L.pytorch.loggers.CSVLogger(run_dir, name="", version=""))
        elif name == "tensorboard":
            # purge_step hides the events a killed run wrote after its checkpoint (TensorBoard's restart rule)
            purge: dict[str, Any] = {"purge_step": resume.step + 1} if resume is not None else {}
            loggers.append(L.pytorch.loggers.TensorBoardLogger(run_dir, name="tb", version="", **purge))
        else:
            loggers.append(make_wandb_logger(lcfg.wandb, run_dir, OmegaConf.to_container(cfg, resolve=True), resume))
    return loggers


def _wandb_logger_class():
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.utilities import rank_zero_only

    class StepWandbLogger(WandbLogger):
        """Lightning's W&B logger with W&B's step = the optimizer step, so that a rewind to a
        checkpoint's step cuts the history exactly there."""

        @rank_zero_only
        def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
            if step is None:
                return super().log_metrics(metrics, step)
            self.experiment.log({**metrics, "trainer/global_step": step}, step=step)

    return StepWandbLogger


def make_wandb_logger(wcfg: WandbConfig, run_dir: Path, config: Any = None, resume: ResumePoint | None = None):
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
    if offline and "x_transaction_log_flush_interval" in getattr(wandb.Settings, "model_fields", {}):
        # an offline run's file is written every 15 s by default: a SIGKILL loses what was not, and a
        # resume then rewinds to a step the file never got (a gap, not a duplicate); 2 s narrows that
        kwargs["settings"] = {"x_transaction_log_flush_interval": OFFLINE_FLUSH_S}
    name = wcfg.name or Path(run_dir).name
    common = dict(save_dir=str(run_dir), project=wcfg.project, entity=wcfg.entity, group=wcfg.group,
                  tags=list(wcfg.tags) or None, **kwargs)
    cls = _wandb_logger_class()
    if resume is None or resume.wandb_id is None:
        return cls(name=name, config=config, **common)
    if "resume_from" in inspect.signature(wandb.init).parameters:
        # resume=None: Lightning's default "allow" and resume_from exclude each other
        logger = cls(name=name, config=config, resume=None, resume_from=f"{resume.wandb_id}?_step={resume.step}", **common)
        try:
            logger.experiment  # noqa: B018 - start the run now, so that a refused rewind falls back here
            return logger
        except Exception as err:  # noqa: BLE001 - rewind is a preview feature a server may refuse
            log.warning("W&B refused to rewind run %s to step %d (%s); logging to a continuation run instead",
                        resume.wandb_id, resume.step, str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
    continuation = {**(config or {}), "resumed_from": {"run_id": resume.wandb_id, "step": resume.step}}
    return cls(name=f"{name}-resumed-step{resume.step}", config=continuation, **common)


def _is_wandb(logger: Any) -> bool:
    """A W&B logger (Lightning's, or our StepWandbLogger subclass of it); the import loads no wandb."""
    from lightning.pytorch.loggers import WandbLogger

    return isinstance(logger, WandbLogger)


def wandb_run_id(loggers: list) -> str | None:
    """The id of the W&B run these loggers write to, if any (it rides in checkpoints)."""
    for logger in loggers:
        if _is_wandb(logger) and getattr(logger, "_experiment", None) is not None:
            return str(logger.experiment.id)
    return None


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
        if not _is_wandb(logger) or getattr(logger, "_experiment", None) is None:
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
