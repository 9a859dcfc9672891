"""The environment record in summary.json: versions, threads and the source commit as they are."""

import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import torch

from diffusion_rl.core.environment import environment, source_commit


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_record_names_the_running_versions_and_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        env = environment()
    finally:
        torch.set_num_threads(threads)
    assert env["torch_threads"] == 1
    assert env["packages"]["torch"] == torch.__version__
    assert env["packages"]["lightning"] == metadata.version("lightning")
    assert env["packages"]["hydra-core"] == metadata.version("hydra-core")
    assert env["cpu"] and env["python"].count(".") == 2


def test_the_source_commit_and_whether_tracked_files_differ_from_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "one")
    head = git(repo, "rev-parse", "HEAD")
    assert source_commit(repo / "a.py") == {"commit": head, "dirty": False}
    (repo / "new.py").write_text("untracked\n")  # untracked files do not change what ran from the commit
    assert source_commit(repo / "a.py") == {"commit": head, "dirty": False}
    assert source_commit(repo / "new.py") is None  # a copy the checkout does not track (a wheel in a venv there)
    (repo / "a.py").write_text("x = 2\n")
    assert source_commit(repo / "a.py") == {"commit": head, "dirty": True}


def test_outside_a_git_checkout_there_is_no_source_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git does not look above tmp_path
    (tmp_path / "a.py").write_text("x = 1\n")
    assert source_commit(tmp_path / "a.py") is None


def test_this_checkout_reports_its_own_commit():
    import diffusion_rl.core.environment as mod

    here = Path(mod.__file__).resolve()
    try:
        head = git(here.parent, "rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the package is not in a git checkout here (an sdist or a wheel)")
    src = source_commit(here)
    assert src is not None and src["commit"] == head
