"""Every relative link in README.md, ARCHITECTURE.md and docs/*.md resolves: the file it names
exists, and its ``#anchor`` (if any) is a heading of that file (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (a repeated heading gets ``-1``, ``-2``…, as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """``page``'s relative links whose file or anchor does not exist, as ``"target: why"``."""
    broken = []
    for target in LINK.findall(_outside_code(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_check_sees_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## A section: here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section-here) [gone](missing.md) [bad](other.md#nope) "
                    "[self](#title-here)\n\n# Title here\n\n`[code](nowhere.md)`\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nope: no heading with that anchor in other.md"]


def test_the_readme_stays_a_front_page() -> None:
    """README.md is the front page (issue 35: at most 250 lines, the rest in docs/), and keeps
    the Quick start's `make run`, which the demo's Docs assistant is asked about."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "## Quick start" in readme and "make run" in readme.split("## Quick start", 1)[1]


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_guide_opens_with_a_table_of_contents(page: Path) -> None:
    """Each docs/ page lists its sections near its top, and every entry names a heading of the page."""
    head = page.read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert "**Contents**" in head
    entries = re.findall(r"^\s*- \[[^\]]+\]\(#([^)]+)\)", head, flags=re.M)
    assert entries and set(entries) <= anchors(page)
