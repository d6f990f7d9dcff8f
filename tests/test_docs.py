"""The README and docs/ link to each other's sections by anchor (the README's figures point at the
benchmark page's section that measured them). A heading renamed, or a section moved, left a link that
opens the page's top: found none today, but the benchmark page has 60+ sections whose headings carry
stop numbers and dates. GitHub's anchor rules: lower-case, punctuation but `-` and `_` dropped, each
space a `-`, a repeated heading numbered `-1`, `-2`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]*?)(?:#([^)\s]+))?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> Iterator[str]:
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)$", line)
        if m:
            a = anchor(m.group(1))
            seen[a] = seen.get(a, -1) + 1
            yield a if seen[a] == 0 else f"{a}-{seen[a]}"


def links(page: Path) -> list[tuple[str, str | None]]:
    """(target, anchor) of each relative link outside code blocks; web links left out."""
    return [(m.group(1), m.group(2)) for m in LINK.finditer(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", m.group(1))]


def test_anchor_follows_github(tmp_path):
    assert anchor("A perfect predictor: the oracle diagnostic (`selection.oracle`, seeds 0 1, 2026-12-04)") \
        == "a-perfect-predictor-the-oracle-diagnostic-selectionoracle-seeds-0-1-2026-12-04"
    assert anchor("End points, δ = 0.25 decided") == "end-points-δ--025-decided"
    page = tmp_path / "page.md"
    page.write_text("# Runs\n## Runs\n```\n# not a heading\n```\n"
                    "[a](#runs-1) [b](other.md#x) [c](https://x.org/#y)\n")
    assert list(anchors(page)) == ["runs", "runs-1"]
    assert links(page) == [("", "runs-1"), ("other.md", "x")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_opens_a_file_and_section_that_exist(page):
    broken = []
    for target, section in links(page):
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif section and path.suffix == ".md" and section not in set(anchors(path)):
            broken.append(f"{target}#{section}: no such heading in {path.relative_to(REPO)}")
    assert not broken, broken
