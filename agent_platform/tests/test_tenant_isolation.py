"""The cross-tenant matrix: every endpoint, called with another tenant's token, answers 404
(never data, never 403 that would confirm the object exists)."""

from __future__ import annotations

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory, ProviderFactory, RouteEntryFactory
from capabilities.models import McpServer, Skill
from documents.models import Document
from sessions.models import Artifact, ChatSession, Message, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def theirs(other_world):
    """One of everything, owned by the other tenant."""
    t = other_world.tenant
    entry = RouteEntryFactory(tenant=t)
    agent = AgentFactory(tenant=t, route=entry.route)
    server = McpServer.all_tenants.create(tenant=t, name="srv", alias="srv", transport="streamable_http",
                                          url="https://mcp.example.com/mcp")
    binding = CapabilityBinding.all_tenants.create(tenant=t, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server)
    skill = Skill.all_tenants.create(tenant=t, name="their-skill", description="secret", instructions="secret")
    session = ChatSession.all_tenants.create(tenant=t, agent=agent, user=other_world.member, title="secret title")
    run = Run.all_tenants.create(tenant=t, session=session, user=other_world.member, input="secret input")
    Message.all_tenants.create(tenant=t, session=session, run=run, role="user", content="secret input", position=0)
    artifact = Artifact.all_tenants.create(tenant=t, session=session, run=run, name="secret.txt",
                                           mime_type="text/plain", size_bytes=6, content=b"secret")
    document = Document.all_tenants.create(tenant=t, session=session, created_by_run=run, title="secret doc",
                                           content="secret content")
    return {
        "provider": entry.provider, "route": entry.route, "agent": agent, "server": server,
        "binding": binding, "session": session, "run": run, "artifact": artifact, "document": document,
        "skill": skill,
    }


def _assert_404(response):
    assert response.status_code == 404, response.content
    body = response.json()
    assert set(body) == {"message", "extra"}
    assert "secret" not in response.content.decode()


def test_end_user_endpoints_hide_other_tenants_objects(world, theirs):
    client = world.client()
    _assert_404(client.get(f"/api/v1/sessions/{theirs['session'].pk}/"))
    _assert_404(client.post(f"/api/v1/sessions/{theirs['session'].pk}/messages/", {"content": "hi"}, format="json"))
    _assert_404(client.get(f"/api/v1/runs/{theirs['run'].pk}/"))
    _assert_404(client.get(f"/api/v1/runs/{theirs['run'].pk}/activities/"))
    _assert_404(client.get(f"/api/v1/sessions/{theirs['session'].pk}/artifacts/"))
    _assert_404(client.get(f"/api/v1/artifacts/{theirs['artifact'].pk}/"))
    _assert_404(client.get(f"/api/v1/artifacts/{theirs['artifact'].pk}/content"))
    _assert_404(client.get(f"/api/v1/documents/{theirs['document'].pk}/"))
    assert client.get("/api/v1/documents/").json()["results"] == []
    assert client.get(f"/api/v1/documents/?session={theirs['session'].pk}").json()["results"] == []
    _assert_404(client.post("/api/v1/sessions/", {"agent": theirs["agent"].pk}, format="json"))
    listed = client.get("/api/v1/agents/").json()["results"]
    assert theirs["agent"].pk not in [a["id"] for a in listed]
    assert client.get("/api/v1/sessions/").json()["results"] == []


def test_browser_device_endpoints_hide_other_tenants_devices(world, other_world):
    from browser.models import BrowserDevice

    device = BrowserDevice.all_tenants.create(tenant=other_world.tenant, user=other_world.member, name="secret laptop",
                                              token_prefix="apd_x", token_hash="0" * 64)
    for client in (world.client(), world.client(admin=True)):
        _assert_404(client.get(f"/api/v1/browser/devices/{device.pk}/"))
        _assert_404(client.delete(f"/api/v1/browser/devices/{device.pk}/"))
        assert client.get("/api/v1/browser/devices/").json()["results"] == []
    device.refresh_from_db()
    assert device.revoked_at is None


def test_missing_and_foreign_objects_get_the_same_message(world, theirs):
    client = world.client()
    foreign = client.get(f"/api/v1/runs/{theirs['run'].pk}/").json()
    missing = client.get("/api/v1/runs/999999/").json()
    assert foreign == missing == {"message": "Run not found.", "extra": {}}


@pytest.mark.parametrize("kind", ["providers", "routes", "agents", "mcp-servers", "bindings", "skills"])
def test_admin_endpoints_hide_other_tenants_objects(world, theirs, kind):
    key = {"providers": "provider", "routes": "route", "agents": "agent", "mcp-servers": "server",
           "bindings": "binding", "skills": "skill"}[kind]
    client = world.client(admin=True)
    url = f"/api/v1/admin/{kind}/{theirs[key].pk}/"
    _assert_404(client.get(url))
    _assert_404(client.patch(url, {"name": "hijacked"}, format="json"))
    _assert_404(client.delete(url))
    listed = client.get(f"/api/v1/admin/{kind}/").json()["results"]
    assert theirs[key].pk not in [item["id"] for item in listed]


def test_admin_cannot_point_at_other_tenants_objects(world, theirs):
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/agents/", {"name": "x", "route": theirs["route"].pk}, format="json")
    assert resp.status_code == 400
    assert "route" in resp.json()["extra"]["fields"]
    mine = AgentFactory(tenant=world.tenant)
    resp = client.post(
        "/api/v1/admin/bindings/",
        {"agent": mine.pk, "kind": "mcp_server", "mcp_server": theirs["server"].pk}, format="json",
    )
    assert resp.status_code == 400
    assert "mcp_server" in resp.json()["extra"]["fields"]
    resp = client.post("/api/v1/admin/bindings/", {"agent": mine.pk, "kind": "skill", "skill": theirs["skill"].pk},
                       format="json")
    assert resp.status_code == 400
    assert "skill" in resp.json()["extra"]["fields"] and "secret" not in resp.content.decode()
    resp = client.post("/api/v1/admin/skills/", {"name": "s", "description": "d", "instructions": "i",
                                                 "model_route": theirs["route"].pk}, format="json")
    assert resp.status_code == 400
    assert "model_route" in resp.json()["extra"]["fields"]


@pytest.mark.parametrize("kind", ["providers", "routes", "agents", "mcp-servers", "bindings", "skills"])
def test_members_get_403_on_admin_endpoints(world, kind):
    resp = world.client().get(f"/api/v1/admin/{kind}/")
    assert resp.status_code == 403
    assert resp.json()["message"] == "Only tenant owners and admins may do this."


def test_unauthenticated_and_revoked_tokens_are_refused(world, client):
    assert client.get("/api/v1/agents/").status_code in (401, 403)
    bad = world.client()
    bad.credentials(HTTP_AUTHORIZATION="Bearer ap_not-a-token")
    resp = bad.get("/api/v1/agents/")
    assert resp.status_code == 401
    assert resp.json() == {"message": "Invalid or revoked token.", "extra": {}}


def test_token_revoke_of_another_members_token_is_404(world, other_world):
    token_id = other_world.member_membership.api_tokens.first().pk
    _assert_404(world.client().post(f"/api/v1/tokens/{token_id}/revoke/"))


def test_provider_api_key_is_write_only_and_encrypted(world):
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/providers/",
                       {"name": "openai", "base_url": "https://api.example.com/v1", "api_key": "sk-abc"}, format="json")
    assert resp.status_code == 201, resp.content
    assert "api_key" not in resp.json() and resp.json()["has_api_key"] is True
    from llm.models import ModelProvider
    row = ModelProvider.all_tenants.get(pk=resp.json()["id"])
    assert row.api_key_encrypted and "sk-abc" not in row.api_key_encrypted


def test_route_with_entries_round_trips(world):
    client = world.client(admin=True)
    p = ProviderFactory(tenant=world.tenant)
    resp = client.post("/api/v1/admin/routes/", {
        "name": "main",
        "entries": [
            {"provider": p.pk, "model": "big", "max_input_tokens": 128000, "tool_calls": "native"},
            {"provider": p.pk, "model": "small", "max_input_tokens": 8192, "tool_calls": "text"},
        ],
    }, format="json")
    assert resp.status_code == 201, resp.content
    got = client.get(f"/api/v1/admin/routes/{resp.json()['id']}/").json()
    assert [(e["model"], e["position"]) for e in got["entries"]] == [("big", 0), ("small", 1)]


def test_deleting_a_route_in_use_is_a_409_with_a_message(world):
    agent = AgentFactory(tenant=world.tenant)
    resp = world.client(admin=True).delete(f"/api/v1/admin/routes/{agent.route_id}/")
    assert resp.status_code == 409
    assert resp.json() == {"message": "This object is in use and cannot be deleted.", "extra": {"used_by": [f"agent {agent.pk}"]}}
