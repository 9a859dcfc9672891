"""The CLI driver (``tests/helpers/cli_driver.py``) with ``train()`` replaced by a recorder.

``python -m tests.helpers.record_config cases.json out.json``: runs every case as ``python src/train.py
<args>`` would, in one interpreter, but each job's ``train(cfg, run_dir, sources)`` only writes
``recorded.json`` into its run folder: the config the entry point handed to training, resolved as
``summary.json`` keeps it (``diffusion_rl.app.train.train``), and the sources it was given. So a test
can compare, job by job, what a command line runs with what ``--cfg job`` prints, without training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tests.helpers.cli_driver import run_in_process

RECORDED = "recorded.json"


def recording_train(cfg, run_dir, sources=None) -> dict[str, Any]:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"config": OmegaConf.to_container(cfg, resolve=True),
              "config_sources": None if sources is None else sources.record()}
    (run_dir / RECORDED).write_text(json.dumps(record, default=str))
    return {"run_dir": str(run_dir), "after": {"recorded": 0.0}}


def main() -> None:
    import diffusion_rl.app.train as train_module

    train_module.train = recording_train  # src/train.py imports train inside main, at call time
    cases = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps([run_in_process(c["argv"]) for c in cases]))


if __name__ == "__main__":
    main()
