"""Recursive chunking: headings → paragraphs → sentences → fixed length.

The parser (:mod:`knowledge.parsing`) has already cut a document at its headings into
sections; a chunk never spans two sections, and each chunk keeps its section's heading path
(its context, embedded and indexed with it: :func:`chunk_index_text`). Within a section the
text is split at the coarsest separator that makes every piece fit ``size`` characters:
blank lines (paragraphs), then sentence ends, then spaces, then a fixed window; the pieces are
then merged greedily back into chunks of at most ``size`` characters, and each chunk after the
first of its section starts with up to ``overlap`` characters from the end of the one before
(cut at a word boundary), so a sentence split across two chunks is whole in one of them; a
chunk that starts among a Markdown table's rows starts with the table's header instead, so
its columns keep their names (:func:`split_text`).

Sizes are in characters (the knowledge base's ``chunk_size``, default 500, and
``chunk_overlap``, default 50), as in the design this follows (issue 26: "500 characters with
50 of overlap"). Pure Python, no Django: tested on its own (knowledge/tests/test_chunking.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from knowledge.parsing import Section

HEADING_SEPARATOR = " > "
"""Joins a heading path into one line (``Architecture > Tenancy``)."""
MIN_CHUNK_SIZE = 100
MAX_CHUNK_SIZE = 8_000


@dataclass(frozen=True, slots=True)
class ChunkDraft:
    """One chunk before it is embedded and stored."""

    position: int
    """0-based order of the chunk in its document."""
    headings: tuple[str, ...]
    """The heading path of the section it came from."""
    text: str
    """The chunk's text, at most the chunk size in characters (overlap included)."""

    @property
    def heading(self) -> str:
        return HEADING_SEPARATOR.join(self.headings)


def chunk_index_text(heading: str, text: str) -> str:
    """What is embedded for a chunk: its heading path on a line of its own, then its text.
    (The full-text column indexes the same two fields: knowledge/models.py.)"""
    return f"{heading}\n\n{text}" if heading else text


_SENTENCE_END = re.compile(r"(?<=[.!?…:;])\s+")


def _split_keep(text: str, pattern: re.Pattern[str] | str) -> list[str]:
    """Split ``text`` after each match of ``pattern``, keeping the separator on the left part
    (so joining the parts gives ``text`` back)."""
    regex = re.compile(re.escape(pattern)) if isinstance(pattern, str) else pattern
    parts, start = [], 0
    for match in regex.finditer(text):
        if match.end() > start:
            parts.append(text[start:match.end()])
            start = match.end()
    if start < len(text):
        parts.append(text[start:])
    return [p for p in parts if p]


_SPLITTERS: tuple[Callable[[str], list[str]], ...] = (
    lambda t: _split_keep(t, re.compile(r"\n\s*\n")),  # paragraphs
    lambda t: _split_keep(t, "\n"),  # lines (lists, code, tables)
    lambda t: _split_keep(t, _SENTENCE_END),  # sentences
    lambda t: _split_keep(t, re.compile(r"\s+")),  # words
)


def _units(text: str, limit: int, level: int = 0) -> list[str]:
    """``text`` cut into pieces of at most ``limit`` characters, at the coarsest separator
    that does it (joining them gives ``text`` back)."""
    if len(text) <= limit:
        return [text]
    if level >= len(_SPLITTERS):
        return [text[i:i + limit] for i in range(0, len(text), limit)]  # fixed length, the last resort
    out: list[str] = []
    for part in _SPLITTERS[level](text):
        out.extend(_units(part, limit, level + 1) if len(part) > limit else [part])
    return out


def _tail(text: str, overlap: int) -> str:
    """The last ``overlap`` characters of ``text``, starting at a word boundary when there is
    one ('' for no overlap)."""
    if overlap <= 0:
        return ""
    tail = text[-overlap:]
    if len(text) > overlap and not text[-overlap - 1].isspace():
        cut = re.search(r"\s", tail)
        tail = tail[cut.end():] if cut else tail
    return tail.lstrip()


_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)+\|?\s*$")
"""A Markdown (GFM) table's delimiter row: ``|---|:--:|``."""


@dataclass(frozen=True, slots=True)
class _Table:
    rows_start: int
    """Offset of the first body row (after the delimiter row) in the section text."""
    end: int
    """Offset just past the last row."""
    header: str
    """The header row and the delimiter row, stripped, on two lines."""


def _tables(text: str) -> list[_Table]:
    """The Markdown tables of ``text``: a row (a line holding ``|``) followed by a delimiter
    row, then the body rows (lines holding ``|``) up to the first line without one."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    tables, i = [], 0
    while i + 1 < len(lines):
        if "|" in lines[i] and _TABLE_DELIMITER.match(lines[i + 1]):
            j = i + 2
            while j < len(lines) and "|" in lines[j] and lines[j].strip():
                j += 1
            tables.append(_Table(starts[i + 2], starts[j], lines[i].strip() + "\n" + lines[i + 1].strip()))
            i = j
        else:
            i += 1
    return tables


def split_text(text: str, *, size: int, overlap: int) -> list[str]:
    """Split one section's text into chunks of at most ``size`` characters with ``overlap``.

    A chunk that starts among a Markdown table's body rows starts with that table's header row
    and delimiter row instead of the overlap (a row fragment from the chunk before would say
    less than the column names do), so every chunk of a long table reads as a table whose
    columns are named: a settings table's "default" column, a limits table's "per user /
    per tenant". A header longer than ``size // 2`` is not repeated.

    Args:
        text: The section text.
        size: Chunk size in characters (≥ 1).
        overlap: Characters repeated from the end of the previous chunk, 0 ≤ overlap < size.

    Returns:
        The chunks in order, stripped, none empty.
    """
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"need size ≥ 1 and 0 ≤ overlap < size (got size={size}, overlap={overlap})")
    tables = [t for t in _tables(text) if len(t.header) < size // 2]
    reserve = max([overlap, *(len(t.header) + 1 for t in tables)])
    chunks: list[str] = []
    current = ""
    offset = 0  # of the unit in ``text`` (the units joined give ``text`` back)
    for unit in _units(text, size - reserve):
        if current and len(current) + len(unit) > size:
            chunks.append(current.strip())
            current = _next_start(current, unit, offset, tables, overlap=overlap, size=size)
        else:
            current += unit
        offset += len(unit)
    if current.strip():
        chunks.append(current.strip())
    return [c for c in chunks if c]


def _next_start(previous: str, unit: str, offset: int, tables: list[_Table], *, overlap: int, size: int) -> str:
    """The start of the chunk after ``previous`` whose first unit is ``unit`` (at ``offset`` in
    the section text): the table's header when the unit is among a table's rows, else the
    overlap tail of ``previous``, then the unit."""
    table = next((t for t in tables if t.rows_start <= offset < t.end), None)
    if table is not None:
        start = table.header + "\n" + unit.lstrip()
    else:
        tail = _tail(previous.rstrip(), overlap)
        # The tail ends in a word and the unit is stripped: always a separator between them (an
        # indented continuation line, "…on every\n  attempt of…", once became "everyattempt");
        # a line break when the unit starts a line of its own.
        joint = "\n" if unit[:1] == "\n" else " "
        start = (tail + joint + unit.lstrip()) if tail else unit
    return start if len(start) <= size else unit  # longer cannot happen with units ≤ size - reserve: a guard


def chunk_sections(sections: Iterable[Section], *, size: int = 500, overlap: int = 50) -> list[ChunkDraft]:
    """Chunk a parsed document's sections (see the module docstring).

    Args:
        sections: In document order.
        size: Characters per chunk, :data:`MIN_CHUNK_SIZE` … :data:`MAX_CHUNK_SIZE`.
        overlap: 0 ≤ overlap ≤ size / 2.

    Returns:
        Chunks numbered from 0 in document order.

    Raises:
        ValueError: size or overlap out of range.
    """
    if not MIN_CHUNK_SIZE <= size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk size must be {MIN_CHUNK_SIZE}…{MAX_CHUNK_SIZE} characters (got {size})")
    if not 0 <= overlap <= size // 2:
        raise ValueError(f"chunk overlap must be 0…{size // 2} characters for size {size} (got {overlap})")
    drafts: list[ChunkDraft] = []
    for section in sections:
        for text in split_text(section.text, size=size, overlap=overlap):
            drafts.append(ChunkDraft(position=len(drafts), headings=section.headings, text=text))
    return drafts
