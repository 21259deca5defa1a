"""Section, line-range and unique-replace edits on Markdown text (pure functions)."""

from __future__ import annotations

import pytest

from documents.markdown import (
    MarkdownEditError,
    headings,
    line_range,
    replace_section,
    replace_text,
    section_text,
)

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

DOC = """# Report

Intro.

## Setup

Install it.

### Details

Deep.

## Results

Numbers.

```bash
## not a heading
```
"""


def test_headings_skip_fenced_code():
    assert [(h.line, h.level, h.title) for h in headings(DOC)] == [
        (0, 1, "Report"), (4, 2, "Setup"), (8, 3, "Details"), (12, 2, "Results"),
    ]


def test_a_section_includes_its_subsections():
    text, first, last = section_text(DOC, "setup")
    assert text == "## Setup\n\nInstall it.\n\n### Details\n\nDeep."
    assert (first, last) == (5, 11)


def test_replace_section_keeps_the_heading_and_the_next_section():
    out = replace_section(DOC, "Setup", "Run `make`.\n")
    assert "## Setup\n\nRun `make`.\n\n## Results\n\nNumbers." in out
    assert "Install it." not in out and "Deep." not in out
    assert out.startswith("# Report\n\nIntro.\n\n")


def test_replace_the_last_section():
    out = replace_section(DOC, "## Results", "None yet.")
    assert out.endswith("## Results\n\nNone yet.\n")
    assert replace_section("# A\n\nold", "A", "new") == "# A\n\nnew"


def test_the_heading_level_disambiguates():
    doc = "# A\n\n## Notes\n\none\n\n# B\n\n### Notes\n\ntwo\n"
    with pytest.raises(MarkdownEditError) as info:
        replace_section(doc, "Notes", "x")
    assert info.value.code == "ambiguous" and "lines 3, 9" in info.value.message
    assert "### Notes\n\nx" in replace_section(doc, "### Notes", "x")


def test_a_missing_section_lists_the_headings():
    with pytest.raises(MarkdownEditError) as info:
        section_text(DOC, "Conclusion")
    assert info.value.code == "not_found"
    assert "'## Setup'" in info.value.message and "'## Results'" in info.value.message


def test_replace_text_needs_exactly_one_match():
    assert replace_text("a b c", "b", "B") == "a B c"
    with pytest.raises(MarkdownEditError) as info:
        replace_text("x x", "x", "y")
    assert (info.value.code, "2 times" in info.value.message) == ("ambiguous", True)
    with pytest.raises(MarkdownEditError) as info:
        replace_text("x", "z", "y")
    assert info.value.code == "not_found"
    with pytest.raises(MarkdownEditError) as info:
        replace_text("x", "", "y")
    assert info.value.code == "invalid_arguments"


def test_line_ranges_are_one_based_and_clamped():
    assert line_range("a\nb\nc", 2, 3) == ("b\nc", 2, 3)
    assert line_range("a\nb\nc", 2, 99) == ("b\nc", 2, 3)
    assert line_range("a\nb\nc", None, None) == ("a\nb\nc", 1, 3)
    assert line_range("a\nb\n", None, None) == ("a\nb", 1, 2)
    assert line_range("", None, None) == ("", 0, 0)
    for bad in [(0, 1), (3, 2), (9, None)]:
        with pytest.raises(MarkdownEditError):
            line_range("a\nb\nc", *bad)
