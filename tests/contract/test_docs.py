"""The README is the front page of docs/: every page is linked from it, every relative link in the
README and under docs/ leads to a file of the repository, and no page points outside the repository
(the project's shared folder) or at a specification that is not in it."""

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """The text outside code blocks and code spans (a command line is not a link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def relative_links(page: Path) -> list[str]:
    """The targets of the page's markdown links that have no scheme, anchors stripped."""
    targets = []
    for target in LINK.findall(prose(page.read_text())):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t).resolve() for t in relative_links(ROOT / "README.md")}
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files {broken}"


def test_link_parsing(tmp_path):
    """Links are read from prose only; schemes and anchors are handled."""
    page = tmp_path / "page.md"
    page.write_text("[a](docs/x.md#part) ![b](img.png) [c](https://e.org/y) [d](#top) `[e](no.md)`\n"
                    "``[g](no.md)`` text\n```bash\n[f](no.md)\n```\n[h\nwrapped](y.md)\n")
    assert relative_links(page) == ["docs/x.md", "img.png", "y.md"]
