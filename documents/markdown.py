"""Pure text operations on Markdown documents: sections by heading, line ranges, unique replace.

A *section* is an ATX heading line (``#`` … ``######``) and everything after it up to the next
heading of the same or a higher level (fewer ``#``), so a section includes its subsections.
Headings inside fenced code blocks (````` or ``~~~``) are not headings. Setext headings
(underlined with ``===``) are not recognised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


class MarkdownEditError(Exception):
    """An edit could not be applied; ``code`` is ``not_found``, ``ambiguous`` or ``invalid_arguments``."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class Heading:
    line: int
    """0-based line index."""
    level: int
    """1 … 6."""
    title: str


def headings(text: str) -> list[Heading]:
    """The ATX headings of ``text`` outside fenced code, in order."""
    found: list[Heading] = []
    fence: str | None = None
    for i, line in enumerate(text.split("\n")):
        fence_match = _FENCE.match(line)
        if fence_match:
            marker = fence_match.group(1)
            if fence is None:
                fence = marker[0] * len(marker)
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None and (match := _HEADING.match(line)):
            found.append(Heading(line=i, level=len(match.group(1)), title=match.group(2).strip()))
    return found


def _normalise(title: str) -> str:
    return re.sub(r"\s+", " ", title.strip().lstrip("#").strip()).casefold()


def find_section(text: str, section: str) -> tuple[int, int, Heading]:
    """Lines ``[start, end)`` of the section whose heading is ``section``.

    ``section`` is the heading's text (case-insensitive, spaces collapsed), optionally with its
    ``#`` marks ("## Setup" matches only a level-2 "Setup").

    Raises:
        MarkdownEditError: ``not_found`` (the message lists the headings) or ``ambiguous``.
    """
    if not isinstance(section, str) or not section.strip():
        raise MarkdownEditError("`section` must be a heading's text, e.g. 'Installation'.", code="invalid_arguments")
    wanted = section.strip()
    level = len(wanted) - len(wanted.lstrip("#")) if wanted.startswith("#") else None
    all_headings = headings(text)
    matches = [h for h in all_headings
               if _normalise(h.title) == _normalise(wanted) and (level is None or h.level == level)]
    if not matches:
        listed = ", ".join(repr("#" * h.level + " " + h.title) for h in all_headings[:50]) or "none"
        raise MarkdownEditError(f"No section with the heading {section!r}. Headings: {listed}.", code="not_found")
    if len(matches) > 1:
        lines = ", ".join(str(h.line + 1) for h in matches)
        raise MarkdownEditError(
            f"{len(matches)} sections are headed {section!r} (lines {lines}); give the heading with its "
            "'#' level, or patch with old_text/new_text instead.",
            code="ambiguous",
        )
    heading = matches[0]
    lines = text.split("\n")
    end = len(lines)
    for h in all_headings:
        if h.line > heading.line and h.level <= heading.level:
            end = h.line
            break
    return heading.line, end, heading


def section_text(text: str, section: str) -> tuple[str, int, int]:
    """The section (heading included) and its 1-based first and last line numbers."""
    start, end, _ = find_section(text, section)
    lines = text.split("\n")[start:end]
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()
        end -= 1
    return "\n".join(lines), start + 1, end


def replace_section(text: str, section: str, body: str) -> str:
    """``text`` with the body of ``section`` (the lines under its heading, subsections
    included) replaced by ``body``. The heading line stays; a blank line separates the new
    body from the next section."""
    trailing_newline = text.endswith("\n")
    if trailing_newline:
        text = text[:-1]
    start, end, _ = find_section(text, section)
    lines = text.split("\n")
    new_body = body.strip("\n").split("\n") if body.strip() else []
    after = lines[end:]
    replacement = [""] + new_body if new_body else []
    if after:
        replacement.append("")
    return "\n".join(lines[:start + 1] + replacement + after) + ("\n" if trailing_newline else "")


def replace_text(text: str, old: str, new: str) -> str:
    """``text`` with the one occurrence of ``old`` replaced by ``new``.

    Raises:
        MarkdownEditError: ``invalid_arguments`` (empty ``old``), ``not_found`` (0 matches) or
            ``ambiguous`` (more than one; the message gives the count).
    """
    if not isinstance(old, str) or not old:
        raise MarkdownEditError("`old_text` must be a non-empty string copied from the document.",
                                code="invalid_arguments")
    if not isinstance(new, str):
        raise MarkdownEditError("`new_text` must be a string.", code="invalid_arguments")
    count = text.count(old)
    if count == 0:
        raise MarkdownEditError("`old_text` was not found in the document; read it with op 'get' and copy the "
                                "text exactly (spaces and line breaks included).", code="not_found")
    if count > 1:
        raise MarkdownEditError(f"`old_text` occurs {count} times; include more surrounding text so it matches once.",
                                code="ambiguous")
    return text.replace(old, new, 1)


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` split on ``\\n``; a final newline ends the last line rather than
    starting an empty one ("a\\nb\\n" has 2 lines, "" has 0)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def line_range(text: str, line_start: int | None, line_end: int | None) -> tuple[str, int, int]:
    """Lines ``line_start`` … ``line_end`` (1-based, inclusive; None = first/last line).

    Returns:
        ``(text, first, last)`` with the range clamped to the document.

    Raises:
        MarkdownEditError(``invalid_arguments``): a bound below 1, or start after end.
    """
    lines = split_lines(text)
    if not lines and line_start is None and line_end is None:
        return "", 0, 0
    first = 1 if line_start is None else line_start
    last = len(lines) if line_end is None else min(line_end, len(lines))
    if first < 1 or (line_end is not None and line_end < 1):
        raise MarkdownEditError("Line numbers start at 1.", code="invalid_arguments")
    if first > len(lines):
        raise MarkdownEditError(f"The document has only {len(lines)} lines.", code="invalid_arguments")
    if first > last:
        raise MarkdownEditError("`line_start` must not be after `line_end`.", code="invalid_arguments")
    return "\n".join(lines[first - 1:last]), first, last
