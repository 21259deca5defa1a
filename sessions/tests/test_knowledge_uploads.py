"""A chat's attachments added to the user's own knowledge base ("Add to knowledge"):
allowed only by an agent whose knowledge binding has ``user_uploads``, only for the chat's
own user and tenant (404 otherwise), the same content never twice; the document is ingested by
the Celery worker and then found by ``knowledge_search`` in that user's runs and not in
another user's.

Real PostgreSQL (pgvector), Redis and Celery worker, the real embedded embedder
(``embedding_server``) as the tenant's default, the scripted model server (``fake_llm``).
"""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route
from knowledge.models import Document, KnowledgeBase
from knowledge.tests.test_kind import SAILING, _kb
from llm.embeddings import DEFAULT_EMBEDDING_MODEL, DEFAULT_EMBEDDING_PROVIDER_NAME
from llm.testing import Reply, ToolCalls
from sessions.knowledge_uploads import NOT_ALLOWED_MESSAGE, UPLOADS_KNOWLEDGE_BASE
from sessions.models import ChatSession, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.services import artifact_create, chat_session_create
from sessions.tests.conftest import post_message_sync
from tenants.models import Membership, Role
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)

LOCKERS = b"""# Locker rules

Every member gets a locker in the west corridor. The locker code is changed each spring;
the current code is 2468, and lost keys are replaced at the front desk for five euros.
"""


@pytest.fixture
def sent(monkeypatch):
    """Ingestion tasks are recorded, not sent (the tests that ingest use the real worker)."""
    calls: list[dict] = []
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: calls.append(kwargs))
    return calls


@pytest.fixture
def embedder(settings, embedding_server):
    """The tenants' default embedding provider is created pointing at the test's real embedder."""
    settings.EMBEDDINGS_BASE_URL = embedding_server
    return embedding_server


def _agent(world, fake_llm_url: str, config: dict | None, name: str = "Helper"):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm_url], name=name)
    if config is not None:
        binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind="knowledge", config=config)
        binding.full_clean()
        binding.save()
    return agent


def _chat(world, agent, user=None) -> ChatSession:
    with tenant_scope(world.tenant.pk):
        return chat_session_create(user=user or world.member, agent=agent)


def _attach(client, session, name="lockers.md", data=LOCKERS, mime="text/markdown") -> int:
    r = client.post(f"/api/v1/sessions/{session.pk}/attachments/",
                    {"file": SimpleUploadedFile(name, data, content_type=mime)}, format="multipart")
    assert r.status_code == 201, r.content
    return r.json()[0]["id"]


def _add(client, session_id, artifact_id):
    return client.post(f"/api/v1/sessions/{session_id}/artifacts/{artifact_id}/add-to-knowledge/")


def _uploads_kb(world, user) -> KnowledgeBase | None:
    return KnowledgeBase.all_tenants.filter(tenant=world.tenant, owner=user, name=UPLOADS_KNOWLEDGE_BASE).first()


# --- the API ---------------------------------------------------------------------------------


def test_an_attachment_goes_into_the_users_own_knowledge_base_once(world, sent):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    session = _chat(world, agent)
    client = world.client()
    artifact_id = _attach(client, session)

    info = client.get(f"/api/v1/sessions/{session.pk}/knowledge-uploads/").json()
    assert info == {"user_uploads": True, "knowledge_base": None,
                    "attachments": [{"artifact_id": artifact_id, "name": "lockers.md", "supported": True,
                                     "document": None}]}

    r = _add(client, session.pk, artifact_id)
    assert r.status_code == 202, r.content
    doc = r.json()
    assert doc["status"] == "queued" and doc["source"] == "lockers.md" and doc["source_kind"] == "file"
    kb = _uploads_kb(world, world.member)
    assert kb is not None and doc["knowledge_base"] == kb.pk
    # The user's own, with the tenant's default (embedded) embedder.
    assert kb.embedding_provider.name == DEFAULT_EMBEDDING_PROVIDER_NAME
    assert (kb.embedding_model, kb.dimensions) == (DEFAULT_EMBEDDING_MODEL, 384)
    assert [c["document_id"] for c in sent] == [doc["id"]]

    # Again, and the same file attached to another chat: the same document, no new ingestion.
    again = _add(client, session.pk, artifact_id)
    assert again.status_code == 200 and again.json()["id"] == doc["id"]
    other_chat = _chat(world, agent)
    copy_id = _attach(client, other_chat, name="copy-of-lockers.md")
    copy = _add(client, other_chat.pk, copy_id)
    assert copy.status_code == 200 and copy.json()["id"] == doc["id"]
    assert Document.all_tenants.filter(knowledge_base=kb).count() == 1 and len(sent) == 1

    info = client.get(f"/api/v1/sessions/{other_chat.pk}/knowledge-uploads/").json()
    assert info["knowledge_base"] == kb.pk and info["attachments"][0]["document"]["id"] == doc["id"]
    # The document is the user's, readable through the knowledge API.
    r = client.get(f"/api/v1/knowledge-bases/{kb.pk}/documents/{doc['id']}/")
    assert r.status_code == 200 and r.json()["status"] == "queued"

    # A failed document is ingested again when added again.
    Document.all_tenants.filter(pk=doc["id"]).update(status="failed", status_reason="Embedding failed")
    retry = _add(client, session.pk, artifact_id)
    assert retry.status_code == 202 and retry.json()["status"] == "queued" and len(sent) == 2


def test_not_allowed_by_the_agent_is_403_with_a_message(world, sent):
    without_uploads = _agent(world, "http://127.0.0.1:9/v1", None, name="No knowledge")
    disabled = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True}, name="Disabled")
    CapabilityBinding.all_tenants.filter(agent=disabled).update(enabled=False)
    client = world.client()
    for agent in (without_uploads, disabled):
        session = _chat(world, agent)
        artifact_id = _attach(client, session)
        r = _add(client, session.pk, artifact_id)
        assert r.status_code == 403, r.content
        assert r.json()["message"] == NOT_ALLOWED_MESSAGE
        assert client.get(f"/api/v1/sessions/{session.pk}/knowledge-uploads/").json()["user_uploads"] is False
    assert _uploads_kb(world, world.member) is None and not sent


def test_a_binding_without_user_uploads_is_not_allowed(world, embedder, sent):
    club = _kb(world.tenant, embedder, "Club", SAILING)
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [club.pk]})
    session = _chat(world, agent)
    client = world.client()
    r = _add(client, session.pk, _attach(client, session))
    assert r.status_code == 403 and r.json()["message"] == NOT_ALLOWED_MESSAGE


def test_another_users_or_tenants_chat_or_artifact_is_404(world, other_world, sent):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    session = _chat(world, agent)
    artifact_id = _attach(world.client(), session)
    # Another user of the tenant (an admin too) and a user of another tenant: the chat is not found.
    for client in (world.client(admin=True), other_world.client()):
        r = _add(client, session.pk, artifact_id)
        assert r.status_code == 404 and r.json()["message"] == "Session not found.", r.content
        assert client.get(f"/api/v1/sessions/{session.pk}/knowledge-uploads/").status_code == 404
    # Another user's artifact through one's own chat: not found, like a missing one.
    admins_chat = _chat(world, agent, user=world.admin)
    for missing in (artifact_id, 10**9):
        r = _add(world.client(admin=True), admins_chat.pk, missing)
        assert r.status_code == 404 and r.json()["message"] == "Artifact not found."
    # Another tenant's user with a chat of their own, naming this tenant's artifact.
    theirs = _agent(other_world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    their_chat = _chat(other_world, theirs)
    r = _add(other_world.client(), their_chat.pk, artifact_id)
    assert r.status_code == 404 and r.json()["message"] == "Artifact not found."
    assert not KnowledgeBase.all_tenants.filter(name=UPLOADS_KNOWLEDGE_BASE).exists() and not sent


def test_a_tool_made_file_and_an_unsupported_type_are_refused(world, sent, no_enqueue):
    agent = _agent(world, "http://127.0.0.1:9/v1", {"knowledge_bases": [], "user_uploads": True})
    session = _chat(world, agent)
    client = world.client()
    run = post_message_sync(agent=agent, user=world.member, content="Take a screenshot", session=session)
    with tenant_scope(world.tenant.pk):
        made = artifact_create(tenant_id=world.tenant.pk, session_id=session.pk, run_id=run.pk, name="output.txt",
                               mime_type="text/plain", data=b"tool output")
    r = _add(client, session.pk, made.pk)
    assert r.status_code == 400 and "attached" in r.json()["message"]
    picture = _attach(client, session, name="pic.png", data=b"\x89PNG\r\n\x1a\nxxxx", mime="image/png")
    r = _add(client, session.pk, picture)
    assert r.status_code == 415 and "Unsupported file type" in r.json()["message"]
    listed = client.get(f"/api/v1/sessions/{session.pk}/knowledge-uploads/").json()["attachments"]
    assert [(a["name"], a["supported"]) for a in listed] == [("pic.png", False)]  # tools' files are not listed
    assert not Document.all_tenants.exists() and not sent


# --- ingested by the worker, then searched in the user's runs only -----------------------------


def _wait_for_status(document_id: int, *, timeout_seconds: float = 120.0) -> Document:
    """The document once the worker has finished with it (ready or failed)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        doc = Document.all_tenants.defer("content").get(pk=document_id)
        if doc.status in ("ready", "failed") or time.monotonic() > deadline:
            return doc
        time.sleep(0.2)


def _search_run(fake_llm, agent, user, question):
    fake_llm.script(ToolCalls([("knowledge_search", {"query": question})]), Reply("Done."))
    run = post_message_sync(agent=agent, user=user, content=question)
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    [call] = ToolCall.all_tenants.filter(run_id=run.pk)
    assert call.status == "succeeded", call.error
    return call.result_data["citations"]


@pytest.mark.timeout(300)
def test_the_added_file_is_ingested_and_searched_for_its_user_only(world, fake_llm, embedder, celery_worker,
                                                                    no_enqueue):
    club = _kb(world.tenant, embedder, "Club", SAILING)
    agent = _agent(world, fake_llm.base_url, {"knowledge_bases": [club.pk], "top_k": 5, "user_uploads": True})
    session = _chat(world, agent)
    client = world.client()
    r = _add(client, session.pk, _attach(client, session))
    assert r.status_code == 202, r.content

    doc = _wait_for_status(r.json()["id"])  # the Celery worker ingests it
    assert doc.status == "ready", doc.status_reason
    assert doc.title == "Locker rules" and doc.chunk_count >= 1
    shown = client.get(f"/api/v1/sessions/{session.pk}/knowledge-uploads/").json()["attachments"][0]["document"]
    assert shown["status"] == "ready" and shown["progress"] == 1.0

    question = "What is the locker code?"
    mine = _search_run(fake_llm, agent, world.member, question)
    assert "Locker rules" in {c["document_title"] for c in mine}
    assert any("2468" in c["snippet"] for c in mine if c["document_title"] == "Locker rules")

    bob = type(world.member).objects.create_user(username="bob-uploads", password="x")
    Membership.all_tenants.create(tenant=world.tenant, user=bob, role=Role.MEMBER)
    theirs = _search_run(fake_llm, agent, bob, question)
    assert "Locker rules" not in {c["document_title"] for c in theirs}
    assert {c["knowledge_base_id"] for c in theirs} <= {club.pk}
