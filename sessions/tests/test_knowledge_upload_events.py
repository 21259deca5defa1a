"""Document status as events: a document added from a chat ("Add to knowledge") publishes
``document_status_changed`` to that chat's event stream on each status change (queued,
parsing, embedding with its progress, ready; failed with the reason), once the change has
committed; a document added elsewhere publishes nothing to the chat; the payloads match
sessions/event_types.py (conftest's check).

Real PostgreSQL and Redis; the ingestion is run by the test; the fake embedder stands in for
the tenant's default embedding model.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from knowledge.ingestion import document_ingest
from knowledge.models import Document
from knowledge.services import document_add_text, document_reingest
from knowledge.tests.fake_embedder import running
from sessions.events import events_since_sync
from sessions.knowledge_uploads import uploads_knowledge_base_get
from sessions.tests.test_knowledge_uploads import _add, _agent, _attach, _chat
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

LONG = ("# Harbour guide\n\n" + "\n\n".join(
    f"## Pier {i}\n\nPier {i} has moorings for sailing boats, a fuel dock and a crane for winter storage."
    for i in range(40))).encode()


@pytest.fixture
def default_embedder(settings):
    """The tenant's default embedding provider (made on first use) points at a fake embedder."""
    with running() as embedder:
        settings.EMBEDDINGS_BASE_URL = embedder.base_url
        yield embedder


@pytest.fixture
def sent(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: calls.append(kwargs))
    return calls


def _status_events(session_id: int) -> list[dict]:
    return [e["data"] for e in events_since_sync(session_id=session_id, after_seq=0)
            if e["type"] == "document_status_changed"]


def _ingest(document_id: int, tenant_id: int) -> str:
    doc = Document.all_tenants.get(pk=document_id)
    with tenant_scope(tenant_id):
        return document_ingest(document_id=doc.pk, generation=doc.generation)


def test_each_status_change_of_a_document_added_from_a_chat_is_published_to_that_chat(
        world, default_embedder, sent):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    session = _chat(world, agent)
    client = world.client()
    r = _add(client, session.pk, _attach(client, session, name="harbour.md", data=LONG))
    assert r.status_code == 202 and r.json()["chat_session_id"] == session.pk
    doc_id = r.json()["id"]
    queued = _status_events(session.pk)
    assert [e["status"] for e in queued] == ["queued"]
    assert queued[0] == {"document_id": doc_id, "knowledge_base_id": r.json()["knowledge_base"],
                         "title": "harbour.md", "status": "queued", "status_reason": "", "chunk_count": 0,
                         "embedded_count": 0, "progress": 0.0}

    assert _ingest(doc_id, world.tenant.pk) == "ready"
    events = _status_events(session.pk)
    doc = Document.all_tenants.get(pk=doc_id)
    assert doc.chunk_count > 32  # more than one embedding batch: progress events between
    assert [e["status"] for e in events] == ["queued", "parsing", "embedding", "embedding", "embedding", "ready"]
    embedding = [e for e in events if e["status"] == "embedding"]
    assert [e["embedded_count"] for e in embedding] == [0, 32, doc.chunk_count]
    assert [e["progress"] for e in embedding] == [0.0, round(32 / doc.chunk_count, 3), 1.0]
    assert events[-1] | {"title": None} == {
        "document_id": doc_id, "knowledge_base_id": doc.knowledge_base_id, "title": None, "status": "ready",
        "status_reason": "", "chunk_count": doc.chunk_count, "embedded_count": doc.chunk_count, "progress": 1.0}
    assert events[-1]["title"] == "Harbour guide"  # the parsed title, as the document API shows it


def test_a_failure_is_published_with_its_reason_and_only_after_the_commit(world, default_embedder, sent):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    session = _chat(world, agent)
    client = world.client()
    doc_id = _add(client, session.pk, _attach(client, session, name="blank.md", data=b"  \n\n  ")).json()["id"]
    assert _ingest(doc_id, world.tenant.pk) == "failed"
    assert _status_events(session.pk)[-1] | {"document_id": 0, "knowledge_base_id": 0} == {
        "document_id": 0, "knowledge_base_id": 0, "title": "blank.md", "status": "failed",
        "status_reason": "The document has no text.", "chunk_count": 0, "embedded_count": 0, "progress": 0.0}
    count = len(_status_events(session.pk))

    # Queued again in a transaction: nothing until it commits; nothing at all if it rolls back.
    doc = Document.all_tenants.get(pk=doc_id)
    with tenant_scope(world.tenant.pk):
        with transaction.atomic():
            document_reingest(document=doc)
            assert len(_status_events(session.pk)) == count
        assert [e["status"] for e in _status_events(session.pk)[count:]] == ["queued"]
        with pytest.raises(RuntimeError), transaction.atomic():
            document_reingest(document=doc)
            raise RuntimeError("rolled back")
    assert len(_status_events(session.pk)) == count + 1


def test_a_document_added_elsewhere_publishes_nothing_to_the_chat(world, default_embedder, sent):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    session = _chat(world, agent)
    client = world.client()
    _add(client, session.pk, _attach(client, session))  # makes the user's knowledge base
    with tenant_scope(world.tenant.pk):
        kb = uploads_knowledge_base_get(user_id=world.member.pk)
        other = document_add_text(knowledge_base=kb, title="Typed in", text="# Typed\n\nAdded through the API.")
    before = len(_status_events(session.pk))
    assert _ingest(other.document.pk, world.tenant.pk) == "ready"
    assert len(_status_events(session.pk)) == before
    assert Document.all_tenants.get(pk=other.document.pk).chat_session_id is None


def test_adding_the_same_file_from_another_chat_moves_its_events_there(world, default_embedder, sent):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    first, second = _chat(world, agent), _chat(world, agent)
    client = world.client()
    doc_id = _add(client, first.pk, _attach(client, first)).json()["id"]
    again = _add(client, second.pk, _attach(client, second, name="copy.md"))
    assert again.status_code == 200 and again.json()["id"] == doc_id and again.json()["chat_session_id"] == second.pk
    assert _ingest(doc_id, world.tenant.pk) == "ready"
    assert [e["status"] for e in _status_events(first.pk)] == ["queued"]
    assert [e["status"] for e in _status_events(second.pk)] == ["parsing", "embedding", "embedding", "ready"]
