"""Hostile DOCX files (issue 34): zip bombs are refused from the archive's sizes and while
streaming, before anything is parsed whole; broken XML, deep nesting and entity definitions
end as a failed document with the reason, never as an exception out of the ingestion task.

The bombs are built streaming (a member written in 1 MB pieces of spaces inside a valid XML
wrapper), so the test holds a few hundred kB, not the bomb's size."""

from __future__ import annotations

import io
import random
import zipfile

import pytest

from knowledge import parsing
from knowledge.ingestion import document_ingest
from knowledge.models import Chunk, Document
from knowledge.parsing import DOCX_MIME, ParseError, parse_document
from knowledge.services import document_add
from knowledge.tests import builders
from tenants.scoping import tenant_scope

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
HEAD = f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document xmlns:w="{W}"><w:body>'.encode()
PARAGRAPH = b"<w:p><w:r><w:t>Run the migrations first.</w:t></w:r></w:p>"
TAIL = b"</w:body></w:document>"
MB = 1_000_000


def _template() -> dict[str, bytes]:
    """A real DOCX's members (python-docx's blank document with one paragraph)."""
    import docx

    document = docx.Document()
    document.add_paragraph("Run the migrations first.")
    out = io.BytesIO()
    document.save(out)
    with zipfile.ZipFile(out) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _docx(document_xml: bytes | None = None, *, filler_mb: int = 0, extra: dict[str, bytes] | None = None) -> bytes:
    """A DOCX whose ``word/document.xml`` is ``document_xml`` (default: one paragraph) or,
    with ``filler_mb``, that many MB of spaces between the paragraph and the end, written in
    1 MB pieces (the archive stays small: deflate packs spaces about 1,000:1)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in _template().items():
            if name == "word/document.xml":
                if filler_mb:
                    with archive.open(name, "w", force_zip64=True) as member:
                        member.write(HEAD + PARAGRAPH)
                        spaces = b" " * MB
                        for _ in range(filler_mb):
                            member.write(spaces)
                        member.write(TAIL)
                    continue
                if document_xml is not None:
                    data = document_xml
            archive.writestr(name, data)
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return out.getvalue()


@pytest.fixture
def bytes_unpacked(monkeypatch):
    """Counts the bytes every zip member read yields (ours and python-docx's); a test sets it
    to 0 after building its DOCX."""
    counted = [0]
    original = zipfile.ZipExtFile.read

    def read(self, n=-1):
        data = original(self, n)
        counted[0] += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    return counted


def test_a_valid_docx_still_parses(bytes_unpacked):
    data = _docx()
    bytes_unpacked[0] = 0
    parsed = parse_document(data, mime_type=DOCX_MIME)
    assert [s.text for s in parsed.sections] == ["Run the migrations first."]
    assert bytes_unpacked[0] > 0  # the counter sees the reads (so the zeros below mean something)


def test_a_30_mb_bomb_is_refused_by_its_compression_ratio_before_it_is_unpacked(bytes_unpacked):
    bomb = _docx(filler_mb=30)
    assert len(bomb) < 100_000
    bytes_unpacked[0] = 0
    with pytest.raises(ParseError, match=r"'word/document\.xml' is compressed [\d,]+:1 .* at most 200:1 is accepted"):
        parse_document(bomb, mime_type=DOCX_MIME)
    assert bytes_unpacked[0] == 0


def test_a_300_mb_bomb_is_refused_by_its_declared_size_before_it_is_unpacked(bytes_unpacked):
    bomb = _docx(filler_mb=300)
    assert len(bomb) < 600_000  # the was 275 kB
    bytes_unpacked[0] = 0
    with pytest.raises(ParseError, match=r"The DOCX unpacks to 300,\d{3},\d{3} bytes; at most 100,000,000"):
        parse_document(bomb, mime_type=DOCX_MIME)
    assert bytes_unpacked[0] == 0


def test_xml_past_the_cap_stops_the_stream_at_the_cap(bytes_unpacked):
    """Members each small and plainly compressed, together past the XML cap: found while
    streaming, having unpacked at most the cap and one read more."""
    rng = random.Random(7)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5_000)]
    block = b"<w:p><w:r><w:t>" + b" ".join(rng.choices(words, k=200_000)) + b"</w:t></w:r></w:p>"  # ~1.2 MB
    count = parsing.MAX_DOCX_XML_BYTES // len(block) + 2
    parts = {f"customXml/extra{i}.xml": b"<root>" + block + b"</root>" for i in range(count)}
    data = _docx(extra=parts)
    assert len(data) < parsing.MAX_DOCUMENT_BYTES
    bytes_unpacked[0] = 0
    with pytest.raises(ParseError, match=r"The DOCX's XML unpacks to more than 25,000,000 bytes \(at 'customXml/extra"):
        parse_document(data, mime_type=DOCX_MIME)
    assert parsing.MAX_DOCX_XML_BYTES < bytes_unpacked[0] <= parsing.MAX_DOCX_XML_BYTES + 65_536 + 100_000


def test_too_many_members_are_refused():
    data = _docx(extra={f"customXml/extra{i}.xml": b"<a/>" for i in range(parsing.MAX_DOCX_MEMBERS)})
    with pytest.raises(ParseError, match=r"holds 2,0\d\d files; at most 2,000"):
        parse_document(data, mime_type=DOCX_MIME)


BROKEN = HEAD + b"<w:p><w:r><w:t>unclosed</w:r></w:p>" + TAIL
DEEP = HEAD + b"<w:p>" + b"<w:r>" * 5_000 + b"</w:r>" * 5_000 + b"</w:p>" + TAIL
_ENTITIES = ['<!ENTITY lol "lol">'] + [f'<!ENTITY lol{n} "{(f"&lol{n - 1};" if n > 1 else "&lol;") * 10}">'
                                        for n in range(1, 10)]
LAUGHS = (f'<?xml version="1.0"?>\n<!DOCTYPE w:document [\n{chr(10).join(_ENTITIES)}\n]>\n'
          f'<w:document xmlns:w="{W}"><w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>').encode()
"""Billion laughs: ``&lol9;`` is 10^9 "lol"s."""


@pytest.mark.parametrize(("document_xml", "reason"), [
    (BROKEN, r"The DOCX's XML could not be parsed: .*(mismatch|Opening and ending tag)"),
    (DEEP, r"The DOCX's XML could not be parsed: .*[Ee]xcessive depth"),
    (LAUGHS, r"'word/document\.xml' declares a DTD"),
    (LAUGHS.decode().replace('encoding="UTF-8" ', "").encode("utf-16"), r"'word/document\.xml' declares a DTD"),
], ids=["broken", "5000-deep", "billion-laughs", "billion-laughs-utf16"])
def test_malformed_xml_is_a_parse_error(document_xml, reason):
    with pytest.raises(ParseError, match=reason):
        parse_document(_docx(document_xml), mime_type=DOCX_MIME)


def test_entities_past_the_dtd_check_are_still_a_parse_error(monkeypatch):
    """Without the archive's DTD refusal, python-docx's parser (no entity resolution, no
    network, libxml2's amplification limits) errs, and that is a parse failure too."""
    monkeypatch.setattr(parsing, "_DTD_MARKERS", ())
    with pytest.raises(ParseError, match="The DOCX"):
        parse_document(_docx(LAUGHS), mime_type=DOCX_MIME)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("content", "reason"), [
    (lambda: _docx(BROKEN), "The DOCX's XML could not be parsed"),
    (lambda: _docx(DEEP), "The DOCX's XML could not be parsed"),
    (lambda: _docx(LAUGHS), "declares a DTD"),
    (lambda: _docx(filler_mb=30), "is compressed"),
], ids=["broken", "5000-deep", "billion-laughs", "bomb"])
def test_the_ingestion_task_fails_the_document_with_the_reason(world, monkeypatch, content, reason):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)
    kb = builders.knowledge_base(world.tenant)  # no embedder: parsing fails first
    with tenant_scope(world.tenant.pk):
        added = document_add(knowledge_base=kb, source_kind="file", source="hostile.docx", content=content(),
                             mime_type=DOCX_MIME)
        assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "failed"
    doc = Document.all_tenants.get(pk=added.document.pk)
    assert doc.status == "failed" and reason in doc.status_reason, doc.status_reason
    assert not doc.status_reason.startswith("Internal error")
    assert not Chunk.all_tenants.filter(document=doc).exists()
