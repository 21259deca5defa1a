"""The knowledge REST API: roles, uploads, status, search, chunks; another tenant's and another
user's objects are 404 everywhere (the same answer as a missing one)."""

from __future__ import annotations

import pytest

from knowledge.ingestion import document_ingest
from knowledge.models import Chunk, Document, KnowledgeBase
from knowledge.tests import builders
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

GUIDE = b"# Guide\n\n## Backups\n\nTake a nightly dump of the database.\n\n## Upgrades\n\nRun the migrations first.\n"


@pytest.fixture
def no_ingest_task(monkeypatch):
    sent = []
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: sent.append(kwargs))
    return sent


def _ingest_all(tenant_id):
    with tenant_scope(tenant_id):
        for doc in Document.objects.filter(status="queued"):
            document_ingest(document_id=doc.pk, generation=doc.generation)


def _404(response, message):
    assert response.status_code == 404, response.content
    assert response.json() == {"message": message, "extra": {}}


def test_roles_decide_who_creates_tenant_wide_and_own_knowledge_bases(world, embedding_server):
    builders.provider(world.tenant, embedding_server)
    member, admin = world.client(), world.client(admin=True)
    refused = member.post("/api/v1/knowledge-bases/", {"name": "Shared", "tenant_wide": True}, format="json")
    assert refused.status_code == 403
    shared = admin.post("/api/v1/knowledge-bases/", {"name": "Shared", "tenant_wide": True}, format="json")
    assert shared.status_code == 201, shared.content
    body = shared.json()
    assert body["tenant_wide"] is True and body["owner"] is None
    assert (body["embedding_model"], body["dimensions"], body["chunk_size"], body["chunk_overlap"]) == (
        "all-minilm-l6-v2", 384, 500, 50)
    own = member.post("/api/v1/knowledge-bases/", {"name": "Mine", "chunk_size": 300, "chunk_overlap": 30},
                      format="json")
    assert own.status_code == 201 and own.json()["owner"] == world.member.pk
    assert sorted(kb["name"] for kb in member.get("/api/v1/knowledge-bases/").json()["results"]) == ["Mine", "Shared"]
    assert [kb["name"] for kb in admin.get("/api/v1/knowledge-bases/").json()["results"]] == ["Shared"]
    assert member.patch(f"/api/v1/knowledge-bases/{body['id']}/", {"name": "x"}, format="json").status_code == 403
    bad = member.post("/api/v1/knowledge-bases/", {"name": "Bad", "chunk_size": 100, "chunk_overlap": 90},
                      format="json")
    assert bad.status_code == 400 and "chunk_overlap" in bad.json()["message"]
    dup = admin.post("/api/v1/knowledge-bases/", {"name": "Shared", "tenant_wide": True}, format="json")
    assert dup.status_code == 400 and dup.json()["message"] == "A knowledge base named 'Shared' exists already."


def test_upload_status_search_and_chunk(world, embedding_server, no_ingest_task):
    kb = builders.knowledge_base(world.tenant, base_url=embedding_server)
    admin, member = world.client(admin=True), world.client()
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = admin.post(f"/api/v1/knowledge-bases/{kb.pk}/documents/",
                        {"file": SimpleUploadedFile("guide.md", GUIDE, content_type="text/markdown"),
                         "tags": "ops, runbook"}, format="multipart")
    assert upload.status_code == 202, upload.content
    doc = upload.json()
    assert (doc["status"], doc["source_kind"], doc["source"], doc["mime_type"], doc["tags"], doc["progress"]) == (
        "queued", "file", "guide.md", "text/markdown", ["ops", "runbook"], 0.0)
    assert member.post(f"/api/v1/knowledge-bases/{kb.pk}/documents/", {"text": "x", "title": "t"},
                       format="json").status_code == 403
    text = admin.post(f"/api/v1/knowledge-bases/{kb.pk}/documents/",
                      {"text": "Opening hours: nine to five.", "title": "Hours"}, format="json")
    assert text.status_code == 202
    _ingest_all(world.tenant.pk)
    same = admin.post(f"/api/v1/knowledge-bases/{kb.pk}/documents/",
                      {"file": SimpleUploadedFile("guide.md", GUIDE, content_type="text/markdown")}, format="multipart")
    assert same.status_code == 200 and same.json()["status"] == "ready"  # same content: no work

    listed = member.get(f"/api/v1/knowledge-bases/{kb.pk}/documents/?status=ready").json()["results"]
    assert {d["title"] for d in listed} == {"Guide", "Hours"} and all(d["progress"] == 1.0 for d in listed)
    found = member.post(f"/api/v1/knowledge-bases/{kb.pk}/search/", {"query": "nightly database dump", "top_k": 2},
                        format="json")
    assert found.status_code == 200, found.content
    hit = found.json()["hits"][0]
    assert hit["heading"] == "Guide > Backups" and "nightly dump" in hit["text"]
    assert set(hit) >= {"knowledge_base_id", "document_id", "document_title", "chunk_id", "position", "score",
                        "vector_rank", "lexical_rank"}
    chunk = member.get(f"/api/v1/knowledge/chunks/{hit['chunk_id']}/")
    assert chunk.status_code == 200
    assert chunk.json()["document_title"] == "Guide" and chunk.json()["text"] == hit["text"]

    reingest = admin.post(f"/api/v1/knowledge-bases/{kb.pk}/documents/{doc['id']}/reingest/")
    assert reingest.status_code == 202 and reingest.json()["status"] == "queued"
    assert admin.delete(f"/api/v1/knowledge-bases/{kb.pk}/documents/{doc['id']}/").status_code == 204
    assert not Chunk.all_tenants.filter(document_id=doc["id"]).exists()


def test_bad_documents_are_refused_with_a_message(world, no_ingest_task):
    kb = builders.knowledge_base(world.tenant)
    admin = world.client(admin=True)
    from django.core.files.uploadedfile import SimpleUploadedFile

    url = f"/api/v1/knowledge-bases/{kb.pk}/documents/"
    exe = admin.post(url, {"file": SimpleUploadedFile("tool.exe", b"MZ\x90\x00", content_type="application/x-msdos")},
                     format="multipart")
    assert exe.status_code == 415 and "Unsupported file type" in exe.json()["message"]
    both = admin.post(url, {"text": "x", "url": "https://example.com/"}, format="json")
    assert both.status_code == 400 and "exactly one" in both.json()["message"]
    no_title = admin.post(url, {"text": "x"}, format="json")
    assert no_title.status_code == 400 and "title" in no_title.json()["message"]
    bad_url = admin.post(url, {"url": "ftp://example.com/x"}, format="json")
    assert bad_url.status_code == 400
    assert not Document.all_tenants.exists()


def test_another_tenants_and_another_users_objects_are_404(world, other_world, no_ingest_task):
    def world_objects(tenant, owner=None, name="KB"):
        kb = builders.knowledge_base(tenant, name, owner=owner)
        doc = builders.document(kb, "secret doc")
        [chunk] = builders.chunks(doc, ["secret text"], [builders.unit([1.0] + [0.0] * 383)])
        return kb, doc, chunk

    foreign = world_objects(other_world.tenant)
    bobs = world_objects(world.tenant, owner=world.admin, name="Admin's own")  # another user's own, same tenant
    for kb, doc, chunk in (foreign, bobs):
        for client in (world.client(), ) if kb.owner_id else (world.client(), world.client(admin=True)):
            base = f"/api/v1/knowledge-bases/{kb.pk}/"
            _404(client.get(base), "Knowledge base not found.")
            _404(client.patch(base, {"name": "hijacked"}, format="json"), "Knowledge base not found.")
            _404(client.get(base + "documents/"), "Knowledge base not found.")
            _404(client.post(base + "documents/", {"text": "x", "title": "t"}, format="json"),
                 "Knowledge base not found.")
            _404(client.get(base + f"documents/{doc.pk}/"), "Knowledge base not found.")
            _404(client.post(base + f"documents/{doc.pk}/reingest/"), "Knowledge base not found.")
            _404(client.delete(base + f"documents/{doc.pk}/"), "Knowledge base not found.")
            _404(client.post(base + "search/", {"query": "secret"}, format="json"), "Knowledge base not found.")
            _404(client.get(f"/api/v1/knowledge/chunks/{chunk.pk}/"), "Chunk not found.")
            _404(client.delete(base), "Knowledge base not found.")
            listed = client.get("/api/v1/knowledge-bases/").json()["results"]
            assert kb.pk not in [k["id"] for k in listed]
    _404(world.client().get("/api/v1/knowledge/chunks/99999999/"), "Chunk not found.")
    assert KnowledgeBase.all_tenants.count() == 2 and Document.all_tenants.count() == 2
    # the admin reads their own knowledge base's chunk; its owner's own document is theirs only
    assert world.client(admin=True).get(f"/api/v1/knowledge/chunks/{bobs[2].pk}/").status_code == 200


def test_a_document_of_another_knowledge_base_is_404_under_this_one(world, no_ingest_task):
    first, second = builders.knowledge_base(world.tenant, "One"), builders.knowledge_base(world.tenant, "Two")
    doc = builders.document(second)
    _404(world.client(admin=True).get(f"/api/v1/knowledge-bases/{first.pk}/documents/{doc.pk}/"), "Document not found.")
