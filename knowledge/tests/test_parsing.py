"""Parsers (no database): text, Markdown, HTML, and a PDF and a DOCX built here with the libraries."""

from __future__ import annotations

import io

import pytest

from knowledge.parsing import (
    DOCX_MIME,
    MAX_DOCUMENT_BYTES,
    ParseError,
    Section,
    detect_mime_type,
    parse_document,
)

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _pdf(pages: list[str], title: str = "") -> bytes:
    """A real PDF with one text line per page (pypdf's writer plus a Helvetica content stream)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(width=612, height=792)
        font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                                 NameObject("/BaseFont"): NameObject("/Helvetica")})
        page[NameObject("/Resources")] = DictionaryObject({
            NameObject("/Font"): DictionaryObject({NameObject("/F1"): font}),
        })
        stream = DecodedStreamObject()
        stream.set_data(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1"))
        page.replace_contents(stream)
    if title:
        writer.add_metadata({"/Title": title})
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _docx() -> bytes:
    import docx

    document = docx.Document()
    document.core_properties.title = "Operations handbook"
    document.add_heading("Deploying", level=1)
    document.add_paragraph("Run the migrations before the web process starts.")
    document.add_heading("Rollback", level=2)
    document.add_paragraph("Keep the previous image tagged.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "setting", "value"
    table.cell(1, 0).text, table.cell(1, 1).text = "WORKERS", "4"
    document.add_heading("Monitoring", level=1)
    document.add_paragraph("Watch the queue length.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_plain_text_is_one_section():
    parsed = parse_document(b"line one\r\nline two\r\n\r\n\r\n\r\nnext paragraph", mime_type="text/plain")
    assert parsed.sections == [Section((), "line one\nline two\n\nnext paragraph")]


def test_markdown_sections_follow_the_headings_and_ignore_hashes_in_code():
    md = (b"# Platform\n\nIntro.\n\n## Install\n\nRun it:\n\n```sh\n# not a heading\nmake run\n```\n\n"
          b"### Docker\n\nUse compose.\n\n## Use\n\nChat.\n\nSetext\n------\n\nUnder setext.\n")
    parsed = parse_document(md, mime_type="text/markdown")
    assert parsed.title == "Platform"
    assert [s.headings for s in parsed.sections] == [
        ("Platform",), ("Platform", "Install"), ("Platform", "Install", "Docker"), ("Platform", "Use"),
        ("Platform", "Setext"),
    ]
    assert "# not a heading" in parsed.sections[1].text
    assert parsed.sections[4].text == "Under setext."


def test_html_keeps_headings_and_drops_page_chrome():
    html = (b"<html><head><title>Runbook</title><script>var x=1;</script></head><body>"
            b"<nav>Home | About</nav><main><h1>Runbook</h1><p>First steps.</p><h2>Restart</h2>"
            b"<p>Restart the <b>worker</b>.</p><ul><li>check logs</li></ul></main><footer>(c) us</footer></body></html>")
    parsed = parse_document(html, mime_type="text/html", base_url="https://example.com/runbook")
    assert parsed.title == "Runbook"
    text = " ".join(s.text for s in parsed.sections)
    assert "Home | About" not in text and "var x" not in text and "(c) us" not in text
    restart = next(s for s in parsed.sections if s.headings[-1:] == ("Restart",))
    assert "Restart the **worker**." in restart.text and "check logs" in restart.text


def test_pdf_text_per_page():
    data = _pdf(["Alpha page text", "Beta page text"], title="Two pages")
    assert detect_mime_type(file_name="upload.bin", head=data[:4096]) == "application/pdf"
    parsed = parse_document(data, mime_type="application/pdf")
    assert parsed.title == "Two pages"
    assert [(s.headings, s.text) for s in parsed.sections] == [
        (("Page 1",), "Alpha page text"), (("Page 2",), "Beta page text")]


def test_docx_headings_from_styles_and_tables_in_place():
    data = _docx()
    assert detect_mime_type(file_name="handbook", head=data[:4096]) == DOCX_MIME
    parsed = parse_document(data, mime_type=DOCX_MIME)
    assert parsed.title == "Operations handbook"
    assert [s.headings for s in parsed.sections] == [("Deploying",), ("Deploying", "Rollback"), ("Monitoring",)]
    assert parsed.sections[1].text == "Keep the previous image tagged.\n\nsetting | value\nWORKERS | 4"


@pytest.mark.parametrize(("data", "mime", "message"), [
    (b"not a pdf at all", "application/pdf", "The PDF could not be read"),
    (b"PK\x03\x04garbage", DOCX_MIME, "The DOCX could not be read"),
    (b"\x00\x01\x02binary", "text/plain", "looks binary"),
    (b"GIF89a", "image/gif", "Unsupported document type"),
])
def test_unreadable_documents_fail_with_a_reason(data, mime, message):
    with pytest.raises(ParseError, match=message):
        parse_document(data, mime_type=mime)


def test_a_pdf_without_text_fails_with_a_reason():
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=100, height=100)
    out = io.BytesIO()
    writer.write(out)
    with pytest.raises(ParseError, match="no extractable text"):
        parse_document(out.getvalue(), mime_type="application/pdf")


def test_size_limit():
    with pytest.raises(ParseError, match="at most"):
        parse_document(b"x" * (MAX_DOCUMENT_BYTES + 1), mime_type="text/plain")


@pytest.mark.parametrize(("name", "declared", "expected"), [
    ("notes.md", "", "text/markdown"), ("page.HTM", "", "text/html"), ("a.txt", "application/octet-stream", "text/plain"),
    ("noext", "text/x-markdown", "text/markdown"), ("noext", "text/csv", "text/plain"), ("x.exe", "", ""),
])
def test_type_detection(name, declared, expected):
    assert detect_mime_type(file_name=name, declared=declared) == expected
