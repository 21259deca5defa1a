"""Documents to text sections with their heading paths: plain text, Markdown, HTML, PDF, DOCX.

A parser turns a document's bytes into a :class:`ParsedDocument`: a title and a list of
:class:`Section`\\ s, each the text under one heading with the path of headings above it
(``("Architecture", "Tenancy")``). The chunker (:mod:`knowledge.chunking`) splits sections
further; chunk boundaries never cross a section.

Libraries (pinned in pyproject.toml): markdown-it-py (Markdown headings, so a ``#`` inside a
code fence is not a heading), BeautifulSoup + lxml + markdownify through
:func:`capabilities.builtin.web.html_to_markdown` (the same clean-up as ``web_read``: scripts,
navigation and page chrome dropped, headings kept as ATX Markdown), pypdf (PDF text per page),
python-docx (DOCX paragraphs, headings from the ``Heading N`` / ``Title`` styles, tables).

Errors are :class:`ParseError` with a message a user can act on; nothing else escapes
:func:`parse_document` for bad input (a corrupt PDF, a DOCX that is not a zip, binary bytes
given as text).
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_DOCUMENT_BYTES = 20_000_000
"""The largest document accepted for parsing: 20 MB (an upload, a fetched URL, a text)."""
MAX_TEXT_CHARS = 5_000_000
"""The most extracted text kept from one document: 5 million characters (~10,000 chunks of
500). A longer extraction fails the document rather than silently dropping its end."""
MAX_PDF_PAGES = 2_000


class ParseError(ValueError):
    """The document cannot be read as its type; ``str(exc)`` says why (shown as the
    document's status reason)."""


@dataclass(frozen=True, slots=True)
class Section:
    """The text under one heading."""

    headings: tuple[str, ...]
    """The heading path, outermost first (``()`` for text before any heading)."""
    text: str
    """The section's own text (not its sub-sections'), paragraphs separated by blank lines."""


@dataclass(slots=True)
class ParsedDocument:
    """What a parser found in one document."""

    title: str
    """The document's own title ('' when it names none: the caller keeps its file name)."""
    sections: list[Section] = field(default_factory=list)

    @property
    def char_count(self) -> int:
        return sum(len(s.text) for s in self.sections)


# ------------------------------------------------------------------------------------ type detection

MIME_BY_EXTENSION = {
    ".txt": "text/plain", ".text": "text/plain", ".log": "text/plain", ".csv": "text/plain", ".rst": "text/plain",
    ".md": "text/markdown", ".markdown": "text/markdown", ".mdown": "text/markdown",
    ".html": "text/html", ".htm": "text/html", ".xhtml": "application/xhtml+xml",
    ".pdf": "application/pdf",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
DOCX_MIME = MIME_BY_EXTENSION[".docx"]
SUPPORTED_MIME_TYPES = ("text/plain", "text/markdown", "text/html", "application/xhtml+xml", "application/pdf",
                        DOCX_MIME)


def detect_mime_type(*, file_name: str = "", declared: str = "", head: bytes = b"") -> str:
    """The MIME type to parse a document as.

    The file's own bytes decide first where they are unambiguous (``%PDF-``, a zip holding
    ``word/``), then the file name's extension, then the declared type (a ``Content-Type``
    header or an upload's), with ``text/x-markdown`` and friends normalised; '' when unknown.
    """
    if head.startswith(b"%PDF-"):
        return "application/pdf"
    if head.startswith(b"PK\x03\x04") and b"word/" in head[:4096]:
        return DOCX_MIME
    name = file_name.lower().rsplit("/", 1)[-1]
    for extension, mime in MIME_BY_EXTENSION.items():
        if name.endswith(extension):
            return mime
    declared = declared.split(";", 1)[0].strip().lower()
    if declared in ("text/x-markdown", "text/md"):
        return "text/markdown"
    if declared in SUPPORTED_MIME_TYPES:
        return declared
    if declared.startswith("text/"):
        return "text/plain"
    return ""


# ------------------------------------------------------------------------------------------ parsers

def _decode(data: bytes, charset: str | None = None) -> str:
    """Bytes as text: the given charset, else UTF-8 (with or without BOM), else Windows-1252.
    Refuses data that looks binary (NUL bytes)."""
    if b"\x00" in data[:8192]:
        raise ParseError("The file looks binary (it contains NUL bytes), not text.")
    for encoding in (charset, "utf-8-sig"):
        if not encoding:
            continue
        try:
            return data.decode(encoding)
        except (LookupError, UnicodeDecodeError):
            continue
    return data.decode("cp1252", errors="replace")


def _paragraphs(text: str) -> str:
    """Normalise line endings and collapse runs of blank lines to one."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def parse_text(data: bytes, *, charset: str | None = None) -> ParsedDocument:
    """Plain text: one section without headings."""
    text = _paragraphs(_decode(data, charset))
    return ParsedDocument(title="", sections=[Section((), text)] if text else [])


def markdown_sections(markdown: str) -> tuple[str, list[Section]]:
    """Split Markdown at its headings (ATX and setext; not inside code), keeping each
    section's Markdown source as its text.

    Returns:
        ``(title, sections)``: the title is the first level-1 heading's text ('' if none).
    """
    from markdown_it import MarkdownIt

    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    tokens = MarkdownIt("commonmark").parse("\n".join(lines))
    headings: list[tuple[int, int, int, str]] = []  # (first line, end line, level, text)
    for index, token in enumerate(tokens):
        if token.type == "heading_open" and token.map:
            inline = tokens[index + 1] if index + 1 < len(tokens) else None
            text = re.sub(r"\s+", " ", inline.content if inline is not None else "").strip()
            headings.append((token.map[0], token.map[1], int(token.tag[1]), text))
    title = next((text for _, _, level, text in headings if level == 1 and text), "")
    sections: list[Section] = []
    path: list[tuple[int, str]] = []

    def add(start: int, end: int) -> None:
        body = _paragraphs("\n".join(lines[start:end]))
        if body:
            sections.append(Section(tuple(text for _, text in path), body))

    cursor = 0
    for first, end, level, text in headings:
        add(cursor, first)
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, text))
        cursor = end
    add(cursor, len(lines))
    return title, sections


def parse_markdown(data: bytes, *, charset: str | None = None) -> ParsedDocument:
    """Markdown: sections per heading (see :func:`markdown_sections`)."""
    title, sections = markdown_sections(_decode(data, charset))
    return ParsedDocument(title=title, sections=sections)


def parse_html(data: bytes, *, charset: str | None = None, base_url: str = "") -> ParsedDocument:
    """HTML: the page's main content as Markdown (web_read's clean-up), then sections per
    heading, each path starting with the page's title. The title is the page's ``<title>``
    (else its first ``<h1>``)."""
    from capabilities.builtin.web import html_to_markdown

    try:
        page_title, markdown = html_to_markdown(_decode(data, charset), base_url=base_url or "about:blank")
    except (ValueError, TypeError, AssertionError) as exc:  # lxml/bs4 refuse some malformed bytes
        raise ParseError(f"The HTML could not be parsed: {exc}.") from exc
    title, sections = markdown_sections(markdown)
    if page_title:  # web_read's Markdown drops a first <h1> equal to the title: the title heads every path
        sections = [s if s.headings[:1] == (page_title,) else Section((page_title, *s.headings), s.text)
                    for s in sections]
    return ParsedDocument(title=page_title or title, sections=sections)


def parse_pdf(data: bytes) -> ParsedDocument:
    """PDF: the text of each page (pypdf's layout-free extraction), one section per page
    headed ``Page N`` (PDFs carry no reliable heading structure). The title is the PDF's
    metadata title, if any.

    Raises:
        ParseError: not a PDF, encrypted, more than :data:`MAX_PDF_PAGES` pages, or no text
            at all (a scanned PDF: there is no OCR).
    """
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise ParseError("The PDF is encrypted; upload a copy without a password.")
        if len(reader.pages) > MAX_PDF_PAGES:
            raise ParseError(f"The PDF has {len(reader.pages):,} pages; at most {MAX_PDF_PAGES:,} are accepted.")
        sections = []
        for number, page in enumerate(reader.pages, start=1):
            text = _paragraphs(page.extract_text() or "")
            if text:
                sections.append(Section((f"Page {number}",), text))
        title = str((reader.metadata or {}).get("/Title") or "").strip()
    except ParseError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise ParseError(f"The PDF could not be read: {type(exc).__name__}: {exc}.") from exc
    if not sections:
        raise ParseError("The PDF has no extractable text (a scan? there is no OCR).")
    return ParsedDocument(title=title, sections=sections)


_DOCX_HEADING = re.compile(r"^heading\s*(\d)$", re.I)


def parse_docx(data: bytes) -> ParsedDocument:
    """DOCX: paragraphs in order, headings from the ``Title`` and ``Heading 1…9`` paragraph
    styles, tables as one line per row (cells joined by `` | ``) at their place.

    Raises:
        ParseError: not a DOCX (not a zip, or no document part).
    """
    import zipfile

    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ParseError(f"The DOCX could not be read: {type(exc).__name__}: {exc}.") from exc
    title = (document.core_properties.title or "").strip()
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []

    def flush() -> None:
        text = _paragraphs("\n\n".join(body))
        if text:
            sections.append(Section(tuple(t for _, t in path), text))
        body.clear()

    for block in document.iter_inner_content():
        if isinstance(block, Table):
            rows = [" | ".join(cell.text.strip() for cell in row.cells) for row in block.rows]
            body.append("\n".join(r for r in rows if r.strip(" |")))
            continue
        if not isinstance(block, Paragraph):
            continue
        text = block.text.strip()
        style = (block.style.name if block.style is not None else "") or ""
        level = 1 if style.lower() == "title" else int(m.group(1)) if (m := _DOCX_HEADING.match(style)) else 0
        if level and text:
            flush()
            if style.lower() == "title" and not title:
                title = text
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, text))
        elif text:
            body.append(text)
    flush()
    return ParsedDocument(title=title, sections=sections)


PARSERS: dict[str, Callable[..., ParsedDocument]] = {
    "text/plain": parse_text,
    "text/markdown": parse_markdown,
    "text/html": parse_html,
    "application/xhtml+xml": parse_html,
    "application/pdf": parse_pdf,
    DOCX_MIME: parse_docx,
}


def parse_document(data: bytes, *, mime_type: str, charset: str | None = None, base_url: str = "") -> ParsedDocument:
    """Parse ``data`` as ``mime_type`` (one of :data:`SUPPORTED_MIME_TYPES`).

    Args:
        data: The document's bytes, at most :data:`MAX_DOCUMENT_BYTES`.
        mime_type: From :func:`detect_mime_type`.
        charset: For text types, the declared charset (else UTF-8, then Windows-1252).
        base_url: For HTML, the page's URL (links made absolute against it).

    Returns:
        The title and sections; sections may be empty (an empty document).

    Raises:
        ParseError: an unsupported type, a document too large, or one its parser cannot read.
    """
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ParseError(f"The document is {len(data):,} bytes; at most {MAX_DOCUMENT_BYTES:,} are accepted.")
    parser = PARSERS.get(mime_type)
    if parser is None:
        supported = "text, Markdown, HTML, PDF, DOCX"
        raise ParseError(f"Unsupported document type {mime_type or 'unknown'!r}; supported: {supported}.")
    if parser in (parse_text, parse_markdown):
        parsed = parser(data, charset=charset)
    elif parser is parse_html:
        parsed = parser(data, charset=charset, base_url=base_url)
    else:
        parsed = parser(data)
    if parsed.char_count > MAX_TEXT_CHARS:
        raise ParseError(f"The document's text is {parsed.char_count:,} characters; at most {MAX_TEXT_CHARS:,} "
                         "are accepted (split it).")
    return parsed
