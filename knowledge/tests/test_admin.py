"""The console's knowledge pages: the knowledge base with its documents, adding documents,
Test search with scores; another tenant's knowledge base is not there."""

from __future__ import annotations

import pytest
from django.test import Client

from knowledge.ingestion import document_ingest
from knowledge.models import Document
from knowledge.tests import builders
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_add_documents_status_and_test_search(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, "Runbooks", base_url=embedding_server)
    console = _console(world.admin)
    page = console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/change/")
    assert page.status_code == 200 and b"Add documents" in page.content and b"Test search" in page.content

    added = console.post(f"/admin/knowledge/knowledgebase/{kb.pk}/add-documents/",
                         {"text_title": "Restarts", "text": "# Restarts\n\nRestart the worker after a deploy.",
                          "tags": "ops"})
    assert added.status_code == 302, added.content.decode()[:500]
    doc = Document.all_tenants.get(knowledge_base=kb)
    assert (doc.title, doc.status, doc.tags) == ("Restarts", "queued", ["ops"])
    with tenant_scope(world.tenant.pk):
        document_ingest(document_id=doc.pk, generation=doc.generation)
    page = console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/change/")
    assert b"Restarts" in page.content and b"1 chunks" in page.content

    found = console.get(f"/admin/knowledge/knowledgebase/{kb.pk}/test-search/", {"query": "restart worker"})
    assert found.status_code == 200
    body = found.content.decode()
    assert 'data-testid="kb-search-hits"' in body and "Restart the worker after a deploy." in body

    missing = console.post(f"/admin/knowledge/knowledgebase/{kb.pk}/add-documents/", {"text": "no title"})
    assert missing.status_code == 200 and "A text needs a title" in missing.content.decode()


def test_another_tenants_knowledge_base_is_not_in_the_console(world, other_world):
    theirs = builders.knowledge_base(other_world.tenant, "Their secrets")
    console = _console(world.admin)
    assert b"Their secrets" not in console.get("/admin/knowledge/knowledgebase/").content
    for url in (f"/admin/knowledge/knowledgebase/{theirs.pk}/change/",
                f"/admin/knowledge/knowledgebase/{theirs.pk}/test-search/?query=x",
                f"/admin/knowledge/knowledgebase/{theirs.pk}/add-documents/"):
        response = console.get(url)
        assert response.status_code in (302, 404), url  # the admin redirects a missing object to the list
        assert b"Their secrets" not in response.content
