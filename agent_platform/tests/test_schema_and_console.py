"""OpenAPI schema and docs; the console (Django admin) as a tenant admin sees it."""

from __future__ import annotations

import re

import pytest

from agents.models import AgentInstance
from agents.tests.factories import AgentFactory, RouteEntryFactory
from sessions.models import ChatSession, Run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def test_openapi_schema_and_docs_are_served_without_a_cdn(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    assert "/api/v1/sessions/{session_id}/messages/" in text and "bearerToken" in text
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert "cdn" not in docs.content.decode().lower() and "/static/drf_spectacular_sidecar/" in docs.content.decode()


def test_tenant_admin_sees_only_their_tenants_agents(client, world, other_world):
    mine = AgentFactory(tenant=world.tenant, name="Mine")
    theirs = AgentFactory(tenant=other_world.tenant, name="Theirs")
    client.force_login(world.admin)
    listing = client.get("/admin/agents/agentinstance/")
    assert listing.status_code == 200
    body = listing.content.decode()
    assert "Mine" in body and "Theirs" not in body
    assert client.get(f"/admin/agents/agentinstance/{mine.pk}/change/").status_code == 200
    foreign = client.get(f"/admin/agents/agentinstance/{theirs.pk}/change/", follow=True)
    assert "Theirs" not in foreign.content.decode().replace("doesn’t exist", "")
    assert foreign.redirect_chain, "a foreign object is treated as missing"


def test_tenant_admin_creates_an_agent_in_their_tenant_only(client, world, other_world):
    my_route = RouteEntryFactory(tenant=world.tenant).route
    their_route = RouteEntryFactory(tenant=other_world.tenant).route
    client.force_login(world.admin)
    form = client.get("/admin/agents/agentinstance/add/").content.decode()
    # The route select's options only (a number field's value="2" is not a route).
    options = re.findall(r'<option value="(\d+)"', form.split('name="route"', 1)[1].split("</select>", 1)[0])
    assert str(my_route.pk) in options and str(their_route.pk) not in options
    data = {
        "name": "Console agent", "description": "", "system_prompt": "hi", "route": my_route.pk,
        "max_loop_count": 16, "tool_max_parallel": 3, "tool_timeout_seconds": 60, "turn_timeout_seconds": 300,
        "run_timeout_seconds": 1800, "message_mode": "queue",
        "is_active": "on",
        "bindings-TOTAL_FORMS": 0, "bindings-INITIAL_FORMS": 0, "bindings-MIN_NUM_FORMS": 0, "bindings-MAX_NUM_FORMS": 1000,
    }
    resp = client.post("/admin/agents/agentinstance/add/", data)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert AgentInstance.all_tenants.get(name="Console agent").tenant_id == world.tenant.pk
    data["route"] = their_route.pk
    data["name"] = "Sneaky"
    resp = client.post("/admin/agents/agentinstance/add/", data)
    assert resp.status_code == 200 and not AgentInstance.all_tenants.filter(name="Sneaky").exists()


def test_runs_are_read_only_and_members_cannot_enter(client, world):
    agent = AgentFactory(tenant=world.tenant)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="hello")
    client.force_login(world.admin)
    page = client.get(f"/admin/agent_sessions/run/{run.pk}/change/", follow=True)  # a run opens as its trace
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.get("/admin/agent_sessions/run/add/").status_code == 403
    client.force_login(world.member)
    assert client.get("/admin/agents/agentinstance/").status_code == 302  # to the login page


def test_provider_api_key_is_encrypted_from_the_console(client, world):
    from llm.models import ModelProvider

    client.force_login(world.admin)
    resp = client.post("/admin/llm/modelprovider/add/", {
        "name": "openai", "api": "openai", "base_url": "https://api.example.com/v1", "api_key": "sk-console-secret",
    })
    assert resp.status_code == 302, resp.content.decode()[:1500]
    provider = ModelProvider.all_tenants.get(name="openai")
    assert provider.tenant_id == world.tenant.pk
    assert provider.api_key_encrypted and "sk-console-secret" not in provider.api_key_encrypted
    page = client.get(f"/admin/llm/modelprovider/{provider.pk}/change/").content.decode()
    assert "sk-console-secret" not in page and provider.api_key_encrypted not in page


def test_console_totals_the_llm_calls_listed_for_the_admins_tenant_only(client, world, other_world):
    from sessions.models import LLMCall

    for w, micros in ((world, 1_250_000), (other_world, 9_000_000)):
        agent = AgentFactory(tenant=w.tenant)
        session = ChatSession.all_tenants.create(tenant=w.tenant, agent=agent, user=w.member)
        run = Run.all_tenants.create(tenant=w.tenant, session=session, user=w.member, input="x")
        LLMCall.all_tenants.create(tenant=w.tenant, run=run, turn=0, attempt=1, entry_index=0, provider_name="p",
                                   model="m", status="succeeded", prompt_tokens=10, completion_tokens=5,
                                   cost_usd_micros=micros)
    client.force_login(world.admin)
    page = client.get("/admin/agent_sessions/llmcall/").content.decode()
    assert "Total of the 1 calls listed: 10 prompt + 5 completion tokens, cost $1.250000." in page
