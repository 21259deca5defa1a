"""GET /api/v1/documents/ and /api/v1/documents/<id>/: the caller's own documents only."""

from __future__ import annotations

import pytest

from agents.tests.factories import AgentFactory
from documents.models import Document
from sessions.models import ChatSession

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _doc(world, user, title, content="# Hi\n\ntext", session=None):
    session = session or ChatSession.all_tenants.create(tenant=world.tenant, agent=AgentFactory(tenant=world.tenant),
                                                        user=user)
    return Document.all_tenants.create(tenant=world.tenant, session=session, title=title, content=content)


def test_list_and_detail_show_the_callers_documents(world):
    first = _doc(world, world.member, "First")
    second = _doc(world, world.member, "Second", content="a\nb\n")
    _doc(world, world.admin, "Colleague's")
    client = world.client()

    listing = client.get("/api/v1/documents/")
    assert listing.status_code == 200
    body = listing.json()
    assert [d["title"] for d in body["results"]] == ["Second", "First"]
    assert body["results"][0]["lines"] == 2 and "content" not in body["results"][0]
    assert set(body["results"][0]) == {"id", "session", "title", "version", "lines", "created_by_run",
                                       "updated_by_run", "created_at", "updated_at"}

    one_session = client.get(f"/api/v1/documents/?session={first.session_id}").json()["results"]
    assert [d["id"] for d in one_session] == [first.pk]

    detail = client.get(f"/api/v1/documents/{second.pk}/")
    assert detail.status_code == 200
    assert (detail.json()["content"], detail.json()["version"], detail.json()["session"]) == (
        "a\nb\n", 1, second.session_id)


def test_other_users_documents_are_404_like_missing_ones(world):
    theirs = _doc(world, world.admin, "secret plan")
    client = world.client()
    foreign = client.get(f"/api/v1/documents/{theirs.pk}/")
    missing = client.get("/api/v1/documents/999999/")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json() == {"message": "Document not found.", "extra": {}}
    assert client.get("/api/v1/documents/").json()["results"] == []


def test_a_bad_session_filter_is_a_400(world):
    resp = world.client().get("/api/v1/documents/?session=abc")
    assert resp.status_code == 400
    assert set(resp.json()) == {"message", "extra"}


def test_unauthenticated_callers_are_refused(client):
    assert client.get("/api/v1/documents/").status_code in (401, 403)


def test_the_endpoints_are_in_the_openapi_schema(client):
    text = client.get("/api/schema/").content.decode()
    assert "/api/v1/documents/:" in text and "/api/v1/documents/{document_id}/:" in text
    assert "DocumentDetail" in text


def test_the_console_lists_the_tenants_documents_read_only(client, world, other_world):
    mine = _doc(world, world.member, "Our report")
    theirs = _doc(other_world, other_world.member, "Their report")
    client.force_login(world.admin)
    listing = client.get("/admin/documents/document/")
    assert listing.status_code == 200
    body = listing.content.decode()
    assert "Our report" in body and "Their report" not in body
    page = client.get(f"/admin/documents/document/{mine.pk}/change/")
    assert page.status_code == 200 and 'name="title"' not in page.content.decode()  # shown, not editable
    assert client.get("/admin/documents/document/add/").status_code == 403
    foreign = client.get(f"/admin/documents/document/{theirs.pk}/change/", follow=True)
    assert "Their report" not in foreign.content.decode()
