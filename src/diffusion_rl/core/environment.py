"""What a run ran on, for its ``summary.json``: package versions, torch's threads, the machine and the
project's commit.

Floating-point sums depend on all of these: the same code, config and warm start scored one Sudoku
puzzle differently before RL in two installs, and the RL runs from there parted. Two runs' numbers are
comparable bit for bit only where their environments match; this record says whether they do.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("lightning", "transformers", "hydra-core", "numpy")


def package_versions() -> dict[str, str | None]:
    """torch's own version string (it names the build: ``+cpu``, ``+cu128``) and the installed
    versions of the other packages a run's numbers depend on; None where one is not installed."""
    out: dict[str, str | None] = {"torch": torch.__version__}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` where there is one (Linux), else ``platform``'s."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit(file: Path) -> dict[str, Any] | None:
    """The git commit of the checkout that tracks ``file`` and whether its tracked files differ from it;
    None where no checkout tracks it (an installed wheel, also one in a virtual environment inside a
    checkout) or git is missing."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(file.parent), *args], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    try:
        git("ls-files", "--error-unmatch", file.name)  # fails where the file is not tracked
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def environment() -> dict[str, Any]:
    """The record ``summary.json`` keeps under ``environment``."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "packages": package_versions(),
            "torch_threads": torch.get_num_threads(), "cpu": cpu_name(), "gpu": gpu,
            "platform": platform.platform(), "source": source_commit(Path(__file__).resolve())}
