"""Ingestion end to end with the real embedded embedder: statuses, chunks, re-adding, deleting,
failure reasons, and the Celery task on a real worker."""

from __future__ import annotations

import http.server
import io
import math
import threading
import time

import pytest
from django.db import connection
from django.test import override_settings

from knowledge.ingestion import document_ingest
from knowledge.models import Chunk, Document, DocumentStatus
from knowledge.services import (
    document_add,
    document_add_text,
    document_add_url,
    document_delete,
    document_reingest,
    knowledge_base_update,
)
from knowledge.tests import builders
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

GUIDE = """# Operations guide

Intro to running the platform.

## Backups

Take a nightly dump of the database. Keep thirty days of dumps in the object store.

## Upgrades

Run the migrations before the new web processes start. Workers drain their queues first.
"""


@pytest.fixture
def no_ingest_task(monkeypatch):
    """The test ingests documents itself (the task is not sent)."""
    sent = []
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: sent.append(kwargs))
    return sent


def _ingest(document: Document) -> str:
    document.refresh_from_db()
    with tenant_scope(document.tenant_id):
        return document_ingest(document_id=document.pk, generation=document.generation)


def _add_text(kb, title, text, **kwargs):
    with tenant_scope(kb.tenant_id):
        return document_add_text(knowledge_base=kb, title=title, text=text, **kwargs)


def test_a_document_is_parsed_chunked_embedded_and_ready(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server, chunk_size=120, chunk_overlap=20)
    added = _add_text(kb, "Operations guide", GUIDE, tags=["ops", "runbook"])
    assert added.queued and added.document.status == DocumentStatus.QUEUED
    assert no_ingest_task == [{"tenant_id": world.tenant.pk, "document_id": added.document.pk,
                               "generation": added.document.generation, "force": False}]
    assert _ingest(added.document) == DocumentStatus.READY
    doc = Document.all_tenants.get(pk=added.document.pk)
    chunks = list(Chunk.all_tenants.filter(document=doc).order_by("position"))
    assert doc.status == "ready" and doc.status_reason == "" and doc.ingested_at is not None
    assert doc.chunk_count == doc.embedded_count == len(chunks) >= 3
    assert doc.tags == ["ops", "runbook"]
    assert [c.position for c in chunks] == list(range(len(chunks)))
    assert all(len(c.text) <= 120 for c in chunks)
    backups = [c for c in chunks if "nightly dump" in c.text]
    assert backups and backups[0].heading == "Operations guide > Backups"
    for c in chunks:
        assert c.dimensions == 384 and len(c.embedding) == 384
        assert math.isclose(math.sqrt(sum(float(x) ** 2 for x in c.embedding)), 1.0, rel_tol=1e-3)
    with connection.cursor() as cursor:  # the generated full-text column indexes the heading path too
        cursor.execute("SELECT count(*) FROM knowledge_chunk WHERE document_id = %s AND "
                       "tsv @@ to_tsquery('english', 'backups & nightly')", [doc.pk])
        assert cursor.fetchone()[0] >= 1


def test_re_adding_same_content_is_no_work_and_changed_content_replaces_the_chunks(
        world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    first = _add_text(kb, "Guide", GUIDE)
    _ingest(first.document)
    old_ids = set(Chunk.all_tenants.filter(document=first.document).values_list("pk", flat=True))
    again = _add_text(kb, "Guide", GUIDE)
    assert not again.queued and again.document.pk == first.document.pk
    assert len(no_ingest_task) == 1
    assert set(Chunk.all_tenants.filter(document=first.document).values_list("pk", flat=True)) == old_ids

    changed = _add_text(kb, "Guide", GUIDE.replace("nightly dump", "weekly snapshot"))
    assert changed.queued and changed.document.pk == first.document.pk and len(no_ingest_task) == 2
    # until the new ingestion is done, the old chunks stay searchable
    assert set(Chunk.all_tenants.filter(document=first.document).values_list("pk", flat=True)) == old_ids
    assert _ingest(changed.document) == "ready"
    new = list(Chunk.all_tenants.filter(document=first.document))
    assert not old_ids & {c.pk for c in new}
    text = " ".join(c.text for c in new)
    assert "weekly snapshot" in text and "nightly dump" not in text
    assert Document.all_tenants.filter(knowledge_base=kb).count() == 1


def test_re_adding_a_file_under_its_own_name_keeps_the_title_its_heading_gave(world, embedding_server, no_ingest_task):
    # seed_demo adds each documentation file with title = its path, every `make run`: the first
    # ingestion replaces that default with the document's level-1 heading; re-adding the
    # unchanged file put the path back (and no ingestion followed to undo it).
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)

    def add(title: str):
        with tenant_scope(kb.tenant_id):
            return document_add(knowledge_base=kb, source_kind="file", source="docs/guide.md",
                                content=GUIDE.encode(), mime_type="text/markdown", title=title)

    first = add("docs/guide.md")
    assert _ingest(first.document) == "ready"
    assert Document.all_tenants.get(pk=first.document.pk).title == "Operations guide"
    again = add("docs/guide.md")
    assert not again.queued and Document.all_tenants.get(pk=first.document.pk).title == "Operations guide"
    renamed = add("The ops guide")  # a title of its own still replaces it
    assert not renamed.queued and Document.all_tenants.get(pk=first.document.pk).title == "The ops guide"


def test_an_older_generation_writes_nothing(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    added = _add_text(kb, "Guide", GUIDE)
    stale_generation = added.document.generation
    with tenant_scope(world.tenant.pk):
        document_reingest(document=added.document)
        assert document_ingest(document_id=added.document.pk, generation=stale_generation) == "stale"
    assert not Chunk.all_tenants.filter(document=added.document).exists()
    assert Document.all_tenants.get(pk=added.document.pk).status == "queued"
    assert _ingest(added.document) == "ready"


def test_deleting_a_document_removes_its_chunks(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    added = _add_text(kb, "Guide", GUIDE)
    _ingest(added.document)
    assert Chunk.all_tenants.filter(document_id=added.document.pk).exists()
    with tenant_scope(world.tenant.pk):
        document_delete(document=added.document)
    assert not Chunk.all_tenants.filter(document_id=added.document.pk).exists()
    assert not Document.all_tenants.filter(pk=added.document.pk).exists()


def test_a_new_chunking_re_ingests_every_document(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    long_section = " ".join(f"Step {i}: check the queue length and the error rate." for i in range(12))
    added = _add_text(kb, "Guide", GUIDE + "\n## Checks\n\n" + long_section)
    _ingest(added.document)
    before = Chunk.all_tenants.filter(document=added.document).count()
    with tenant_scope(world.tenant.pk):
        knowledge_base_update(knowledge_base=kb, chunk_size=100, chunk_overlap=10)
    assert len(no_ingest_task) == 2 and Document.all_tenants.get(pk=added.document.pk).status == "queued"
    assert _ingest(added.document) == "ready"
    assert Chunk.all_tenants.filter(document=added.document).count() > before


@pytest.mark.parametrize(("source", "content", "reason"), [
    ("broken.pdf", b"%PDF-1.4 this is not really a pdf", "The PDF could not be read"),
    ("empty.md", b"   \n\n  ", "The document has no text"),
    ("binary.txt", b"\x00\x01\x02\x03", "looks binary"),
])
def test_unreadable_documents_fail_with_the_reason(world, embedding_server, no_ingest_task, source, content, reason):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    with tenant_scope(world.tenant.pk):
        added = document_add(knowledge_base=kb, source_kind="file", source=source, content=content)
    assert _ingest(added.document) == "failed"
    doc = Document.all_tenants.get(pk=added.document.pk)
    assert doc.status == "failed" and reason in doc.status_reason
    assert not Chunk.all_tenants.filter(document=doc).exists()


def test_an_embedding_failure_fails_the_document_with_the_reason(world, no_ingest_task):
    from conftest import free_port

    kb = builders.knowledge_base(world.tenant, base_url=f"http://127.0.0.1:{free_port()}/v1")  # nobody listens
    added = _add_text(kb, "Guide", GUIDE)
    assert _ingest(added.document) == "failed"
    doc = Document.all_tenants.get(pk=added.document.pk)
    assert doc.status == "failed" and doc.status_reason.startswith("Embedding failed (all-minilm-l6-v2)")


class _Pages(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/guide.html":
            body = (b"<html><head><title>Web guide</title></head><body><main><h1>Web guide</h1>"
                    b"<h2>Restarts</h2><p>Restart the worker after changing its settings.</p></main></body></html>")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
        else:
            body = b"gone"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def pages():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@override_settings(WEB_FETCH_ALLOWED_CIDRS=["127.0.0.0/8"])
def test_a_url_is_fetched_through_the_safe_fetch_and_re_fetched_without_work_when_unchanged(
        world, embedding_server, no_ingest_task, pages):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    with tenant_scope(world.tenant.pk):
        added = document_add_url(knowledge_base=kb, url=f"{pages}/guide.html")
    assert _ingest(added.document) == "ready"
    doc = Document.all_tenants.get(pk=added.document.pk)
    assert doc.title == "Web guide" and doc.mime_type == "text/html" and doc.content_sha256
    chunk = Chunk.all_tenants.get(document=doc)
    assert chunk.heading == "Web guide > Restarts" and "Restart the worker" in chunk.text
    with tenant_scope(world.tenant.pk):
        document_add_url(knowledge_base=kb, url=f"{pages}/guide.html")
    assert _ingest(doc) == "ready"
    assert Chunk.all_tenants.get(document=doc).pk == chunk.pk  # same content: the chunks were kept

    with tenant_scope(world.tenant.pk):
        missing = document_add_url(knowledge_base=kb, url=f"{pages}/missing.html")
    assert _ingest(missing.document) == "failed"
    assert "HTTP 404" in Document.all_tenants.get(pk=missing.document.pk).status_reason


def test_a_url_to_a_private_address_is_refused(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    with tenant_scope(world.tenant.pk):
        added = document_add_url(knowledge_base=kb, url="http://10.1.2.3/secrets.txt")
    assert _ingest(added.document) == "failed"
    reason = Document.all_tenants.get(pk=added.document.pk).status_reason
    assert reason.startswith("Fetching the URL failed (blocked_address)"), reason


def test_the_celery_task_ingests_on_a_worker(world, embedding_server, celery_worker):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    import docx

    handbook = docx.Document()
    handbook.add_heading("Handbook", level=1)
    handbook.add_paragraph("Expenses are reimbursed within ten working days.")
    data = io.BytesIO()
    handbook.save(data)
    with tenant_scope(world.tenant.pk):
        added = document_add(knowledge_base=kb, source_kind="file", source="handbook.docx", content=data.getvalue(),
                             mime_type="application/octet-stream")
    deadline = time.monotonic() + 60
    while (status := Document.all_tenants.get(pk=added.document.pk).status) not in ("ready", "failed"):
        assert time.monotonic() < deadline, f"still {status}"
        time.sleep(0.1)
    doc = Document.all_tenants.get(pk=added.document.pk)
    assert (doc.status, doc.status_reason) == ("ready", "")
    assert Chunk.all_tenants.get(document=doc).heading == "Handbook"
