"""Run many command lines of ``src/*.py`` in one Python process, as ``python src/<script> <args>`` would.

``python tests/helpers/cli_driver.py cases.json out.json``: each case is ``{"argv": ["src/train.py", ...]}``
(script path relative to the repository root, then the arguments); every case runs its script as
``__main__`` (``runpy``) with that ``sys.argv`` in the current folder, and ``out.json`` gets
``{"rc", "stdout", "stderr"}`` per case. One interpreter pays the imports (torch, Lightning,
transformers) once, so a table of bad command lines costs seconds instead of minutes; an uncaught
exception prints its traceback to the case's stderr and gives status 1, as the interpreter would.
``--subprocess`` runs each case as its own ``python`` process instead (the slow tier).
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_in_process(argv: list[str]) -> dict:
    script = str(ROOT / argv[0])
    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    sys.argv = [script, *argv[1:]]
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 - what the interpreter would print
                traceback.print_exc()
                rc = 1
    finally:
        sys.argv = old_argv
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def run_subprocess(argv: list[str]) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=600)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    run = run_subprocess if "--subprocess" in sys.argv else run_in_process
    results = [run(c["argv"]) for c in cases]
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
