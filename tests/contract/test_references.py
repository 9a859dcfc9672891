"""Every document reference resolves inside the repository.

No file cites the external method document (``SPEC §N``, ``SPEC.md``) or a ``../shared`` folder that
a fresh checkout does not have, and every ``docs/methods.md §N`` (or ``§N-M``, ``§N.M``) names a
section heading of docs/methods.md. Run: pytest tests/contract/test_references.py -q
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCANNED_DIRS = ("src", "conf", "tests", "benchmarks", "scripts", "docs")
SCANNED_FILES = ("README.md", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".md", ".toml", ".txt", ".cfg", ".sh", ".ini", ""}
SKIPPED_PARTS = {"__pycache__", "fixtures"}  # fixtures: third-party benchmark data, not our prose
FORBIDDEN = re.compile(r"SPEC §|SPEC\.md|\.\./shared")
REFERENCE = re.compile(r"docs/methods\.md §(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)
METHODS = ROOT / "docs" / "methods.md"


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for folder in SCANNED_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT)
            built = any(part.endswith(".egg-info") for part in rel.parts)  # pip's build output, not ours
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not SKIPPED_PARTS & set(rel.parts) and not built:
                files.append(path)
    return files


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def sections() -> set[str]:
    return set(HEADING.findall(read(METHODS)))


def test_the_method_document_has_every_top_level_section():
    assert {str(n) for n in range(1, 13)} <= sections()


def test_no_reference_leaves_the_repository():
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
            for path in scanned_files() if path != Path(__file__)
            for n, line in enumerate(read(path).splitlines(), 1) if FORBIDDEN.search(line)]
    assert not hits, "cite docs/methods.md §N or tests/fixtures/ instead:\n" + "\n".join(hits)


def test_every_methods_reference_names_a_section():
    known = sections()
    refs, bad = 0, []
    for path in scanned_files():
        if path == Path(__file__):  # its own examples name missing sections on purpose
            continue
        for n, line in enumerate(read(path).splitlines(), 1):
            for m in REFERENCE.finditer(line):
                refs += 1
                first, last = m.group(1), m.group(2)
                wanted = [first] if last is None else [str(i) for i in range(int(first), int(last) + 1)]
                bad += [f"{path.relative_to(ROOT)}:{n}: §{s}" for s in wanted if s not in known]
    assert refs > 0
    assert not bad, "no such section in docs/methods.md:\n" + "\n".join(bad)


@pytest.mark.parametrize("line,ok", [("see docs/methods.md §4", True), ("docs/methods.md §1-3", True),
                                     ("docs/methods.md §13", False), ("docs/methods.md §4.99", False)])
def test_the_checker_itself(line, ok):
    known = sections()
    m = REFERENCE.search(line)
    first, last = m.group(1), m.group(2)
    wanted = [first] if last is None else [str(i) for i in range(int(first), int(last) + 1)]
    assert all(s in known for s in wanted) is ok
