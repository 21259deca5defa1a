"""How a passage is introduced to the model: ``[n] document › heading`` (knowledge.tools)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from knowledge.tools import CitationNumbers, passages_render


def _hit(chunk_id: int, title: str, heading: str, text: str = "Some text."):
    return SimpleNamespace(chunk_id=chunk_id, document_title=title, heading=heading, text=text, knowledge_base_id=1,
                           document_id=chunk_id, position=0, score=0.5)


@pytest.mark.parametrize(("title", "heading", "line"), [
    # a Markdown document's heading path starts with its level-1 heading, its parsed title: said once
    ("Settings reference", "Settings reference > What each does", "[1] Settings reference › What each does"),
    ("Settings reference", "Settings reference", "[1] Settings reference"),
    ("docs/settings.md", "Settings reference > What each does", "[1] docs/settings.md › Settings reference > What each does"),
    ("Handbook", "", "[1] Handbook"),
    ("Settings", "Settings reference > Limits", "[1] Settings › Settings reference > Limits"),  # not a whole heading
])
def test_the_documents_title_is_said_once(title, heading, line):
    text, [citation] = passages_render([_hit(7, title, heading)], CitationNumbers())
    assert text.splitlines()[0] == line
    assert citation["heading"] == heading  # clients get the heading path as stored
