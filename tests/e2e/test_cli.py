"""Every user error is one line and exit status 2 (diffusion_rl/app/cli.py): docs/cli_errors.md's table,
run through the real entry points, and the routing of library logging into the run's log file.

The table's commands run in one subprocess (``tests/helpers/cli_driver.py``: each command is
``python src/<script> <args>`` executed as ``__main__`` in that interpreter, so the imports are paid
once); two of them also run as processes of their own, alongside. ``-m slow`` runs the whole table
as separate processes.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DRIVER = ROOT / "tests" / "helpers" / "cli_driver.py"
ONE_LINE = re.compile(r"^(config|report) error: (?P<key>[\w.\[\]]+)=.+ is invalid: .+$")


def bad_input_table() -> list[tuple[list[str], int, str]]:
    """``(argv, exit status, message)`` of each row of the "Bad input" table in docs/cli_errors.md."""
    text = (ROOT / "docs" / "cli_errors.md").read_text()
    section = text.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `python "):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        command = re.match(r"`([^`]+)`", cells[0]).group(1)
        message = cells[2].strip("`").strip().replace("\\|", "|")
        argv = shlex.split(command)[1:]
        rows.append((argv, int(cells[1]), message))
    return rows


def message_pattern(message: str) -> re.Pattern:
    """The table's message with ``...`` matching anything."""
    return re.compile(".*".join(re.escape(part) for part in message.split("...")))


@pytest.fixture
def workdir(tmp_path, tiny_run):
    """The folder the table assumes: bad.csv, notes.txt and a finished tiny run."""
    (tmp_path / "bad.csv").write_text("Puzzle,Solution\n3102200002100320,3142243142131324\n"
                                      "31022000021003,3142243142131324\n")
    (tmp_path / "notes.txt").write_text("my notes\n")
    shutil.copytree(tiny_run[0], tmp_path / "run")
    return tmp_path


def run_driver(rows, cwd: Path, *flags: str) -> subprocess.Popen:
    (cwd / f"cases{len(flags)}.json").write_text(json.dumps([{"argv": argv} for argv, _, _ in rows]))
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT / "src"), "HOME": str(cwd)}
    return subprocess.Popen([sys.executable, str(DRIVER), f"cases{len(flags)}.json", f"out{len(flags)}.json", *flags],
                            cwd=cwd, env=env)


def check(rows, results) -> None:
    assert len(results) == len(rows)
    for (argv, rc, message), res in zip(rows, results):
        command = " ".join(argv)
        lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
        assert res["rc"] == rc, (command, res["stderr"][-2000:])
        assert "Traceback" not in res["stderr"] and len(lines) == 1, (command, res["stderr"][-2000:])
        m = ONE_LINE.match(lines[0])
        assert m, (command, lines[0])  # names the key, the value and what is allowed
        assert message_pattern(message).fullmatch(lines[0]), (command, lines[0], message)


def test_readme_bad_input_table_is_what_the_entry_points_print(workdir):
    rows = bad_input_table()
    assert len(rows) >= 25 and {argv[0] for argv, _, _ in rows} == {"src/train.py", "src/eval.py", "src/report.py"}
    real = [r for r in rows if r[0] in (["src/train.py", "seed=abc"], ["src/eval.py"])]
    assert len(real) == 2
    sub = workdir / "sub"
    sub.mkdir()
    for name in ("bad.csv", "notes.txt"):
        shutil.copy(workdir / name, sub / name)
    procs = [run_driver(rows, workdir), run_driver(real, sub, "--subprocess")]  # side by side
    assert [p.wait(timeout=900) for p in procs] == [0, 0]
    check(rows, json.loads((workdir / "out0.json").read_text()))
    check(real, json.loads((sub / "out1.json").read_text()))
    # no command left a run folder behind for src/report.py to list as a failed run
    assert not list(workdir.glob("outputs/**/.hydra")) and not list(sub.glob("outputs/**/.hydra"))
    assert not list(workdir.glob("outputs/cache/warmstart/*"))  # and none got as far as a warm start


@pytest.mark.slow
def test_readme_bad_input_table_as_separate_processes(workdir):
    rows = bad_input_table()
    assert run_driver(rows, workdir, "--subprocess").wait(timeout=1800) == 0
    check(rows, json.loads((workdir / "out1.json").read_text()))


def test_library_logging_reaches_the_log_file_and_only_warnings_the_console(tmp_path, monkeypatch):
    import io
    import warnings

    from diffusion_rl.app.cli import route_library_logging

    root = logging.getLogger()
    console_stream = io.StringIO()
    console, file = logging.StreamHandler(console_stream), logging.FileHandler(tmp_path / "train.log")
    lightning_logger = logging.getLogger("lightning.pytorch")
    saved = (root.handlers[:], root.level, lightning_logger.handlers[:], lightning_logger.propagate)
    try:
        root.handlers[:] = [console, file]  # as Hydra's job logging sets them up
        root.setLevel(logging.INFO)
        lightning_logger.addHandler(logging.StreamHandler(io.StringIO()))  # its own, as at import
        lightning_logger.propagate = False
        route_library_logging()
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False")
        logging.getLogger("diffusion_rl.app.train").info("warm start loaded")
        warnings.warn("something a library warns about", UserWarning, stacklevel=1)
        file.flush()
    finally:
        logging.captureWarnings(False)
        root.handlers[:], lightning_logger.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        lightning_logger.propagate = saved[3]
    log_text, console_text = (tmp_path / "train.log").read_text(), console_stream.getvalue()
    assert "GPU available: False" in log_text and "warm start loaded" in log_text
    assert "something a library warns about" in log_text
    assert "GPU available" not in console_text  # a library's info stays in the file
    assert "warm start loaded" in console_text and "something a library warns about" in console_text
