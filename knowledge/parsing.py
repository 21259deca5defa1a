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
given as text, a DOCX whose XML is broken, too deep or declares entities).

A DOCX is a zip, so its bytes say little about what parsing it costs: before python-docx
reads it, :func:`check_docx_archive` looks at the members' declared sizes and compression
ratios, then streams every member out of the archive counting the bytes it really yields,
and stops at the first limit passed (:data:`MAX_DOCX_UNCOMPRESSED_BYTES`,
:data:`MAX_DOCX_XML_BYTES`, :data:`MAX_DOCX_COMPRESSION_RATIO`, :data:`MAX_DOCX_MEMBERS`),
so a zip bomb costs at most those bytes of decompression. A part that declares a DTD is
refused there too (Word never writes one; entity definitions are how XML amplifies itself).
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_DOCUMENT_BYTES = 20_000_000
"""The largest document accepted for parsing: 20 MB (an upload, a fetched URL, a text)."""
MAX_TEXT_CHARS = 5_000_000
"""The most extracted text kept from one document: 5 million characters (~10,000 chunks of
500). A longer extraction fails the document rather than silently dropping its end."""
MAX_PDF_PAGES = 2_000
MAX_DOCX_UNCOMPRESSED_BYTES = 100_000_000
"""The most bytes a DOCX's zip members may hold uncompressed, all together (images included):
100 MB. Checked on the declared sizes first, then on the bytes streamed out of the archive."""
MAX_DOCX_XML_BYTES = 25_000_000
"""The most uncompressed bytes of a DOCX's XML members (what the XML parser builds a tree
from), all together: 25 MB, five times :data:`MAX_TEXT_CHARS` (Word's markup around the text)."""
MAX_DOCX_COMPRESSION_RATIO = 200
"""The highest compression ratio (uncompressed / compressed) accepted for a DOCX member larger
than :data:`DOCX_RATIO_FROM_BYTES`: Word's XML compresses about 5–30:1, a zip bomb about
1,000:1."""
DOCX_RATIO_FROM_BYTES = 1_000_000
MAX_DOCX_MEMBERS = 2_000
"""The most members (files) a DOCX's zip may have."""
_DOCX_READ_CHUNK = 1 << 16
_DTD_MARKERS = tuple("<!DOCTYPE".encode(encoding) for encoding in ("utf-8", "utf-16-le", "utf-16-be"))


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


class _MemberTooLarge(Exception):
    """Raised inside :func:`check_docx_archive`'s read loop; becomes a :class:`ParseError`."""


def _looks_like_xml(head: bytes) -> bool:
    """True unless a member's first read shows it is not XML: XML's ``<`` after whitespace, a
    byte order mark or UTF-16's zero bytes, or nothing but those (counted as XML, to be safe).
    What python-docx may hand the XML parser, whatever the member's name."""
    return head.lstrip(b" \t\r\n\x00\xef\xbb\xbf\xff\xfe")[:1] in (b"<", b"")


def check_docx_archive(data: bytes) -> None:
    """Refuse a DOCX whose zip would cost more than the limits to unpack, before it is parsed.

    First the central directory: at most :data:`MAX_DOCX_MEMBERS` members, their declared
    uncompressed sizes together at most :data:`MAX_DOCX_UNCOMPRESSED_BYTES`, and no member over
    :data:`DOCX_RATIO_FROM_BYTES` compressed more than :data:`MAX_DOCX_COMPRESSION_RATIO`:1.
    Then every member is streamed out (64 KiB reads, nothing kept) counting the bytes it really
    yields, stopping as soon as all members pass :data:`MAX_DOCX_UNCOMPRESSED_BYTES` or the XML
    members pass :data:`MAX_DOCX_XML_BYTES`; an XML member declaring a DTD (``<!DOCTYPE``) is
    refused. The declared sizes also bound what python-docx decompresses afterwards (zipfile
    stops a member at its declared size).

    Args:
        data: The DOCX's bytes.

    Raises:
        ParseError: not a zip, an unreadable or encrypted member, or a limit passed; the
            message names the member and the limit.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, zlib.error, ValueError, EOFError, OSError) as exc:
        raise ParseError(f"The DOCX could not be read: {type(exc).__name__}: {exc}.") from exc
    with archive:
        if len(members) > MAX_DOCX_MEMBERS:
            raise ParseError(f"The DOCX holds {len(members):,} files; at most {MAX_DOCX_MEMBERS:,} are accepted.")
        declared = sum(m.file_size for m in members)
        if declared > MAX_DOCX_UNCOMPRESSED_BYTES:
            raise ParseError(f"The DOCX unpacks to {declared:,} bytes; at most {MAX_DOCX_UNCOMPRESSED_BYTES:,} are "
                             "accepted (a zip bomb?).")
        for member in members:
            ratio = member.file_size / max(member.compress_size, 1)
            if member.file_size > DOCX_RATIO_FROM_BYTES and ratio > MAX_DOCX_COMPRESSION_RATIO:
                raise ParseError(f"The DOCX's part {member.filename!r} is compressed {ratio:,.0f}:1 "
                                 f"({member.file_size:,} bytes from {member.compress_size:,}); at most "
                                 f"{MAX_DOCX_COMPRESSION_RATIO}:1 is accepted (a zip bomb?).")
        total = xml = 0
        try:
            for member in members:
                total, xml = _stream_member(archive, member, total=total, xml=xml)
        except _MemberTooLarge as exc:
            raise ParseError(str(exc)) from None
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, ValueError, EOFError,
                OSError) as exc:
            raise ParseError(f"The DOCX could not be read: {type(exc).__name__}: {exc}.") from exc


def _stream_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, *, total: int, xml: int) -> tuple[int, int]:
    """Read ``member`` out of ``archive`` in chunks, adding its bytes to ``total`` (and to
    ``xml`` when it is XML); raise :class:`_MemberTooLarge` at the first limit passed, and
    :class:`ParseError` for a DTD. Returns the new ``(total, xml)``."""
    is_xml = None
    tail = b""
    with archive.open(member) as stream:
        while chunk := stream.read(_DOCX_READ_CHUNK):
            if is_xml is None:
                is_xml = _looks_like_xml(chunk)
            total += len(chunk)
            if total > MAX_DOCX_UNCOMPRESSED_BYTES:
                raise _MemberTooLarge(f"The DOCX unpacks to more than {MAX_DOCX_UNCOMPRESSED_BYTES:,} bytes (at "
                                      f"{member.filename!r}); that many are accepted at most (a zip bomb?).")
            if is_xml:
                xml += len(chunk)
                if xml > MAX_DOCX_XML_BYTES:
                    raise _MemberTooLarge(f"The DOCX's XML unpacks to more than {MAX_DOCX_XML_BYTES:,} bytes (at "
                                          f"{member.filename!r}); that many are accepted at most (a zip bomb?).")
                if any(marker in tail + chunk for marker in _DTD_MARKERS):
                    raise ParseError(f"The DOCX's part {member.filename!r} declares a DTD (<!DOCTYPE>), which Word "
                                     "never writes; it is refused (entity definitions can expand without bound).")
                tail = chunk[-32:]
    return total, xml


_DOCX_HEADING = re.compile(r"^heading\s*(\d)$", re.I)


def parse_docx(data: bytes) -> ParsedDocument:
    """DOCX: paragraphs in order, headings from the ``Title`` and ``Heading 1…9`` paragraph
    styles, tables as one line per row (cells joined by `` | ``) at their place.

    The archive is checked first (:func:`check_docx_archive`: sizes while streaming, ratios,
    DTDs); python-docx's XML parser resolves no entities, reaches no network and refuses a
    tree deeper than libxml2's default (256 levels), and its errors are parse failures.

    Raises:
        ParseError: not a DOCX (not a zip, or no document part), an archive over the limits,
            or XML that cannot be parsed (broken, too deep, a DTD).
    """
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph
    from lxml import etree

    check_docx_archive(data)
    try:
        document = docx.Document(io.BytesIO(data))
        title = (document.core_properties.title or "").strip()
        blocks = list(document.iter_inner_content())
    except etree.LxmlError as exc:
        raise ParseError(f"The DOCX's XML could not be parsed: {exc}.") from exc
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ParseError(f"The DOCX could not be read: {type(exc).__name__}: {exc}.") from exc
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []

    def flush() -> None:
        text = _paragraphs("\n\n".join(body))
        if text:
            sections.append(Section(tuple(t for _, t in path), text))
        body.clear()

    for block in blocks:
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
