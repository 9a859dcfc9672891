"""Shared start-up of the Hydra entry points: every user error is one line and exit status 2.

- ``--explain`` on the command line prints where each value of that command's config comes from and
  stops without running (:func:`diffusion_rl.app.sources.explain`).

- :func:`run_hydra_app` runs a ``@hydra.main`` function. Hydra's own errors about the command line
  (a key that does not exist, a sweep without ``-m``, a syntax error, a missing config file) would
  print several lines and exit 1; they become one :class:`ConfigError` line (:func:`hydra_error`).
- :func:`hydra_job` runs the job inside ``main``: library logging goes to the run's ``<job>.log``
  (:func:`route_library_logging`), a :class:`ConfigError` exits 2 in one line and leaves no run
  folder behind, a crash of a started run is recorded in ``failed.json`` (``sweep.run_job``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from diffusion_rl.core.errors import ConfigError

if TYPE_CHECKING:
    pass

T = TypeVar("T")
# libraries that log through handlers of their own, bypassing Hydra's console and file handlers
LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "datasets", "wandb")
_job_started = False


def run_hydra_app(main: Callable[[], object], conf_dir: Path, config_name: str = "config") -> None:
    """Run ``main`` (a ``@hydra.main`` function of ``config_name``); a user error exits 2 with one line on
    stderr. With ``--explain`` the composed config's sources are printed instead of running."""
    from diffusion_rl.core.config import check_group_choices

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Hydra then raises its errors instead of printing them: the command-line ones become one line
    # here, and a crash inside the job keeps its whole traceback
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # conf/hydra/launcher/joblib.yaml sets 2 workers over the plugin's schema of the same name, which
    # Hydra 1.3 still supports but announces as deprecated on every run
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/joblib' is validated against ConfigStore schema")
    global _job_started
    _job_started = False
    with exit_on_config_error():
        sys.argv[1:] = sys.argv[1:] + launcher_overrides(sys.argv[1:], os.environ)
        check_group_choices(sys.argv[1:], conf_dir)
        if "--explain" in sys.argv[1:]:
            print(explain_command(sys.argv, conf_dir, config_name))
            return
        try:
            main()
        except Exception as err:
            if _job_started or not _is_command_line_error(err):
                raise
            raise hydra_error(err, sys.argv[1:]) from None


def launcher_overrides(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """What a process started by torchrun or SLURM's ``srun`` adds to its command line.

    Such a launcher starts every process of a run itself (Lightning's own launcher, used for
    ``trainer.devices`` on one machine, passes its processes their folder), and each composes its
    config: all must write into one run folder, so ``hydra.run.dir`` is given (or, under SLURM,
    derived from the job id), and only the first process writes Hydra's files there; the others log
    to ``train_process_<rank>.log`` beside them."""
    ranks = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1)
    torchrun, slurm = "TORCHELASTIC_RUN_ID" in env, "SLURM_STEP_ID" in env and "SLURM_PROCID" in env
    if ranks <= 1 or not (torchrun or slurm):
        return []
    if any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError("--multirun", True, "a sweep cannot run under torchrun or srun: launch one run per job")
    extra = []
    if not any(a.startswith("hydra.run.dir=") for a in argv):
        run_id = env.get("SLURM_JOB_ID") if slurm else env.get("TORCHELASTIC_RUN_ID")
        if not run_id or run_id == "none":
            raise ConfigError("hydra.run.dir", None, "give it when torchrun starts several processes: every process "
                              "writes into the same run folder (e.g. hydra.run.dir=outputs/runs/my_run, on a file "
                              "system every node sees)")
        extra.append(f"hydra.run.dir=outputs/runs/{'slurm' if slurm else 'torchrun'}-{run_id}")
    rank = int(env.get("RANK") or env.get("SLURM_PROCID") or 0)
    if rank > 0:
        extra += ["hydra.output_subdir=null", f"hydra.job.name=train_process_{rank}"]
    return extra


def explain_command(argv: list[str], conf_dir: Path, config_name: str) -> str:
    """What ``--explain`` prints for the command line ``argv``: the config of one job (``-m`` is ignored:
    an experiment's own sweep params are applied to each job on top of what this shows)."""
    from diffusion_rl.app.sources import explain

    overrides = [a for a in argv[1:] if a not in ("--explain", "-m", "--multirun")]
    if flags := [a for a in overrides if a.startswith("-")]:
        raise ConfigError("--explain", " ".join(flags), "takes the command's overrides only (key=value, group=option)")
    if swept := [a for a in overrides if "," in a.partition("=")[2] and not a.partition("=")[2].startswith("[")]:
        raise ConfigError(swept[0].partition("=")[0], swept[0].partition("=")[2],
                          "--explain explains one job: give one value (a sweep's jobs differ only in it)")
    try:
        return explain(conf_dir, overrides, config_name, command=Path(argv[0]).as_posix())
    except Exception as err:
        if not _is_command_line_error(err):
            raise
        raise hydra_error(err, overrides) from None


def job_sources(conf_dir: Path):
    """Inside ``main``: where each value of this job's config came from (:mod:`diffusion_rl.app.sources`)."""
    from hydra.core.hydra_config import HydraConfig

    from diffusion_rl.app.sources import config_sources

    hc = HydraConfig.get()
    return config_sources(conf_dir, list(hc.overrides.task), hc.job.config_name or "config")


def hydra_job(fn: Callable[[Path], T]) -> T | None:
    """Inside ``main``: run ``fn(run_dir)`` as one job of a run or a multirun (see the module docstring)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from diffusion_rl.app.sweep import run_job

    global _job_started
    _job_started = True
    route_library_logging()
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    with exit_on_config_error():  # in a multirun a failed job writes failed.json and the sweep goes on
        return run_job(lambda: fn(run_dir), run_dir, hc.mode == RunMode.MULTIRUN)


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Turn a :class:`ConfigError` into one line on stderr and exit status 2 (Hydra would print more)."""
    try:
        yield
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)


def route_library_logging() -> None:
    """Send what libraries log, and Python warnings, through the root logger's handlers instead of
    the libraries' own stderr handlers: all of it reaches the run's ``<job>.log``, the console shows
    only their warnings and errors (Lightning's "GPU available: False" lines go to the file)."""
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # the library's console handler, not a file
                logger.removeHandler(handler)
        logger.propagate = True
    if "transformers" in sys.modules:  # its handler is re-added lazily unless switched off this way
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler and not any(isinstance(f, _QuietLibraries) for f in handler.filters):
            handler.addFilter(_QuietLibraries())


class _QuietLibraries(logging.Filter):
    """On the console: the libraries' warnings and errors, not their info lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith(LIBRARY_LOGGERS)


# ---- Hydra's errors as one line -------------------------------------------------------------------
def _is_command_line_error(err: BaseException) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(err, (HydraException, OmegaConfBaseException))


def _override_value(argv: list[str], key: str) -> str:
    for arg in argv:
        k, sep, v = arg.partition("=")
        if sep and k.lstrip("+~").removeprefix("override ").strip() == key:
            return v
    return ""


def hydra_error(err: BaseException, argv: list[str]) -> ConfigError:
    """A Hydra composition or parsing error as one :class:`ConfigError` naming the override."""
    from hydra.errors import MissingConfigException, OverrideParseException

    text = str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    if m := re.search(r"Could not override '([^']+)'", text):
        key = m.group(1)
        return ConfigError(key, _override_value(argv, key), "not a key of this config (add a new key with "
                           f"+{key}=..., list the keys with --cfg job)")
    if m := re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", text):
        return ConfigError(m.group(1), m.group(2), "a list needs brackets (key=[a,b]), a sweep needs -m (--multirun)")
    if isinstance(err, OverrideParseException):
        key, _, value = err.override.partition("=")
        reason = " ".join(err.message.split("\n")[0].split())
        return ConfigError(key.lstrip("+~") or "command line", value, f"cannot be parsed ({reason}); quote "
                           "values with special characters, e.g. key='a b'")
    if isinstance(err, MissingConfigException) and (m := re.search(r"Could not find '([^']+)/([^'/]+)'", text)):
        group = m.group(1)
        return ConfigError(group, m.group(2), f"no such config: {group}/{m.group(2)}.yaml"
                           + (f"; allowed: {', '.join(sorted(err.options))}" if err.options else ""))
    full_key = getattr(err, "full_key", None)
    if full_key:
        return ConfigError(str(full_key), _override_value(argv, str(full_key)), " ".join(first.split()))
    return ConfigError("command line", " ".join(argv), " ".join(first.split()))
