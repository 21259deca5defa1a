"""The end-user memory API: the caller's own memories only; another user's or tenant's → 404;
row-level security keeps a tenant's memories from any query made in another tenant's scope."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from agents.tests.factories import AgentFactory
from memory.models import Memory
from memory.tests.factories import memory_binding, memory_make
from sessions.models import ChatSession
from tenants.models import Role
from tenants.scoping import tenant_scope
from tenants.services import api_token_create, membership_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _assert_404(response, message):
    assert response.status_code == 404, response.content
    assert response.json() == {"message": message, "extra": {}}
    assert "secret" not in response.content.decode()


@pytest.fixture
def agent(world):
    agent = AgentFactory(tenant=world.tenant)
    memory_binding(agent, max_items=3)
    return agent


@pytest.fixture
def colleague(world):
    """A second member of the same tenant, with a token."""
    user = get_user_model().objects.create_user(username="acme-colleague", password="pw-colleague-123")
    membership = membership_create(tenant=world.tenant, user=user, role=Role.MEMBER)
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(membership=membership).raw}")
    return user, client


def test_list_shows_the_callers_memories_with_that_agent(world, agent, colleague):
    other_agent = AgentFactory(tenant=world.tenant)
    mine = memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Prefers answers in French.",
                       category="preference")
    memory_make(tenant=world.tenant, user=world.member, agent=other_agent, text="Uses Linux.")
    memory_make(tenant=world.tenant, user=colleague[0], agent=agent, text="secret: colleague's memory")
    body = world.client().get(f"/api/v1/memories/?agent={agent.pk}").json()
    assert body["count"] == 1 and body["memory_enabled"] is True
    assert body["results"][0]["id"] == mine.pk
    assert body["results"][0]["text"] == "Prefers answers in French."
    assert body["results"][0]["category"] == "preference"
    assert "embedding" not in body["results"][0]
    everything = world.client().get("/api/v1/memories/").json()
    assert sorted(m["text"] for m in everything["results"]) == ["Prefers answers in French.", "Uses Linux."]
    assert "memory_enabled" not in everything


def test_list_says_when_memory_is_off(world):
    agent = AgentFactory(tenant=world.tenant)
    body = world.client().get(f"/api/v1/memories/?agent={agent.pk}").json()
    assert body["memory_enabled"] is False and body["results"] == []


def test_bad_agent_parameter(world, other_world):
    theirs = AgentFactory(tenant=other_world.tenant)
    assert world.client().get("/api/v1/memories/?agent=abc").status_code == 400
    _assert_404(world.client().get(f"/api/v1/memories/?agent={theirs.pk}"), "Agent not found.")
    resp = world.client().delete("/api/v1/memories/")
    assert resp.status_code == 400 and "agent" in resp.json()["extra"]["fields"]


def test_delete_one(world, agent):
    m = memory_make(tenant=world.tenant, user=world.member, agent=agent, text="Is vegan.")
    assert world.client().delete(f"/api/v1/memories/{m.pk}/").status_code == 204
    assert not Memory.all_tenants.filter(pk=m.pk).exists()
    _assert_404(world.client().delete(f"/api/v1/memories/{m.pk}/"), "Memory not found.")


def test_delete_all_with_one_agent_keeps_the_rest(world, agent, colleague):
    other_agent = AgentFactory(tenant=world.tenant)
    for i in range(3):
        memory_make(tenant=world.tenant, user=world.member, agent=agent, text=f"Fact {i}.")
    kept = memory_make(tenant=world.tenant, user=world.member, agent=other_agent, text="Kept.")
    theirs = memory_make(tenant=world.tenant, user=colleague[0], agent=agent, text="Colleague's.")
    resp = world.client().delete(f"/api/v1/memories/?agent={agent.pk}")
    assert resp.status_code == 200 and resp.json() == {"deleted": 3}
    assert set(Memory.all_tenants.values_list("pk", flat=True)) == {kept.pk, theirs.pk}


def test_another_users_memory_is_404(world, agent, colleague):
    theirs = memory_make(tenant=world.tenant, user=colleague[0], agent=agent, text="secret colleague fact")
    _assert_404(world.client().delete(f"/api/v1/memories/{theirs.pk}/"), "Memory not found.")
    # an admin of the tenant cannot delete a member's memory through the end-user API either
    _assert_404(world.client(admin=True).delete(f"/api/v1/memories/{theirs.pk}/"), "Memory not found.")
    assert Memory.all_tenants.filter(pk=theirs.pk).exists()
    missing = world.client().delete("/api/v1/memories/999999/").json()
    assert missing == {"message": "Memory not found.", "extra": {}}


def test_another_tenants_memory_is_404(world, other_world):
    their_agent = AgentFactory(tenant=other_world.tenant)
    theirs = memory_make(tenant=other_world.tenant, user=other_world.member, agent=their_agent,
                         text="secret other-tenant fact")
    for client in (world.client(), world.client(admin=True)):
        _assert_404(client.delete(f"/api/v1/memories/{theirs.pk}/"), "Memory not found.")
        assert client.get("/api/v1/memories/").json()["results"] == []
        _assert_404(client.delete(f"/api/v1/memories/?agent={their_agent.pk}"), "Agent not found.")
    assert Memory.all_tenants.filter(pk=theirs.pk).exists()


def test_row_level_security_refuses_other_tenants_memories(world, other_world):
    """Underneath the selectors: in tenant A's scope, PostgreSQL shows and deletes no row of B,
    even through the unscoped manager and raw SQL."""
    their_agent = AgentFactory(tenant=other_world.tenant)
    theirs = memory_make(tenant=other_world.tenant, user=other_world.member, agent=their_agent, text="secret")
    with tenant_scope(world.tenant.pk):
        assert not Memory.all_tenants.filter(pk=theirs.pk).exists()  # tenant-bypass: the test of RLS itself
        assert Memory.all_tenants.filter(pk=theirs.pk).delete()[0] == 0  # tenant-bypass: as above
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM memory_memory")
            assert cursor.fetchone()[0] == 0
            cursor.execute("UPDATE memory_memory SET text = 'hijacked'")
            assert cursor.rowcount == 0
    theirs.refresh_from_db()
    assert theirs.text == "secret"


def test_extract_queues_the_callers_session(world, agent, colleague, monkeypatch):
    sent = []
    monkeypatch.setattr("memory.tasks.memory_extract_session.delay", lambda *args: sent.append(args))
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    resp = world.client().post("/api/v1/memories/extract/", {"session": session.pk}, format="json")
    assert resp.status_code == 202 and resp.json() == {"queued": True}
    assert sent == [(session.pk, world.tenant.pk, True)]
    theirs = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=colleague[0])
    _assert_404(world.client().post("/api/v1/memories/extract/", {"session": theirs.pk}, format="json"),
                "Session not found.")
    assert world.client().post("/api/v1/memories/extract/", {"session": "x"}, format="json").status_code == 400
    assert len(sent) == 1


def test_extract_with_memory_off_is_409(world):
    agent = AgentFactory(tenant=world.tenant)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    resp = world.client().post("/api/v1/memories/extract/", {"session": session.pk}, format="json")
    assert resp.status_code == 409
    assert resp.json() == {"message": "Memory is off for this agent.", "extra": {}}


def test_extract_of_another_tenants_session_is_404(world, other_world, monkeypatch):
    monkeypatch.setattr("memory.tasks.memory_extract_session.delay", lambda *args: pytest.fail("queued"))
    their_agent = AgentFactory(tenant=other_world.tenant)
    memory_binding(their_agent)
    theirs = ChatSession.all_tenants.create(tenant=other_world.tenant, agent=their_agent, user=other_world.member)
    _assert_404(world.client().post("/api/v1/memories/extract/", {"session": theirs.pk}, format="json"),
                "Session not found.")


def test_memory_binding_is_configured_through_the_admin_api(world):
    agent = AgentFactory(tenant=world.tenant)
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "memory",
                                                   "config": {"retention_days": 30, "max_items": 3}}, format="json")
    assert resp.status_code == 201, resp.content
    assert world.client().get(f"/api/v1/memories/?agent={agent.pk}").json()["memory_enabled"] is True
    bad = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "memory",
                                                  "config": {"max_items": 0, "colour": "red"}}, format="json")
    assert bad.status_code == 400
    messages = " ".join(bad.json()["extra"]["fields"]["config"])
    assert "max_items: An integer from 1 to 20." in messages and "colour" in messages
