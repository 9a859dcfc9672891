"""Shared start-up for the Hydra entry points: one-line errors for bad config names and values."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from diffusion_rl.errors import ConfigError


def run_hydra_app(main: Callable[[], object], conf_dir: Path) -> None:
    """Run ``main`` (a ``@hydra.main`` function); a :class:`ConfigError` exits 2 with one line."""
    from diffusion_rl.config import check_group_choices

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    # conf/hydra/launcher/joblib.yaml sets 2 workers over the plugin's schema of the same name, which
    # Hydra 1.3 still supports but announces as deprecated on every run
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/joblib' is validated against ConfigStore schema")
    with exit_on_config_error():
        check_group_choices(sys.argv[1:], conf_dir)
    main()


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Turn a :class:`ConfigError` into one line on stderr and exit status 2 (Hydra would print more)."""
    try:
        yield
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
