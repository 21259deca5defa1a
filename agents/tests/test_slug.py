"""An agent's slug: made from the name on create, editable, unique in its tenant, shown in the
admin API, the end users' agent list and the console (issue 36)."""

from __future__ import annotations

import html
import importlib
import json
import re
import shlex

import pytest
from a2a.types.a2a_pb2 import Role, SendMessageRequest
from django.apps import apps as django_apps
from django.db import connection
from google.protobuf import json_format

from agents.models import SLUG_MAX_LENGTH, AgentInstance, agent_slug_from_name
from agents.tests.factories import AgentFactory, RouteEntryFactory

pytestmark = pytest.mark.django_db


def test_slug_from_name():
    assert agent_slug_from_name("Docs assistant", set()) == "docs-assistant"
    assert agent_slug_from_name("Docs assistant", {"docs-assistant"}) == "docs-assistant-2"
    assert agent_slug_from_name("Docs assistant", {"docs-assistant", "docs-assistant-2"}) == "docs-assistant-3"
    assert agent_slug_from_name("Café Über", set()) == "cafe-uber"
    assert agent_slug_from_name("日本語", set()) == "agent"
    assert agent_slug_from_name("!!!", {"agent"}) == "agent-2"
    long = agent_slug_from_name("x" * 200, {"x" * SLUG_MAX_LENGTH})
    assert long == "x" * (SLUG_MAX_LENGTH - 2) + "-2"


def _create(client, route, **fields):
    return client.post("/api/v1/admin/agents/", {"route": route.pk, **fields}, format="json")


def test_admin_api_makes_accepts_edits_and_refuses_slugs(world, all_tenants_scope):
    route = RouteEntryFactory(tenant=world.tenant).route
    client = world.client(admin=True)

    made = _create(client, route, name="Docs assistant")
    assert made.status_code == 201, made.json()
    assert made.json()["slug"] == "docs-assistant"
    again = _create(client, route, name="Docs Assistant!")
    assert again.status_code == 201 and again.json()["slug"] == "docs-assistant-2"

    given = _create(client, route, name="Support", slug="help-desk")
    assert given.status_code == 201 and given.json()["slug"] == "help-desk"

    taken = _create(client, route, name="Other", slug="help-desk")
    assert taken.status_code == 400
    assert "help-desk" in taken.json()["extra"]["fields"]["slug"][0]

    bad = _create(client, route, name="Bad", slug="Has Spaces")
    assert bad.status_code == 400 and "lowercase" in bad.json()["extra"]["fields"]["slug"][0]

    same_name = _create(client, route, name="Support")
    assert same_name.status_code == 400 and "Support" in same_name.json()["extra"]["fields"]["name"][0]

    pk = given.json()["id"]
    renamed = client.patch(f"/api/v1/admin/agents/{pk}/", {"slug": "support"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["slug"] == "support"
    assert AgentInstance.all_tenants.get(pk=pk).slug == "support"
    clash = client.patch(f"/api/v1/admin/agents/{pk}/", {"slug": "docs-assistant"}, format="json")
    assert clash.status_code == 400 and AgentInstance.all_tenants.get(pk=pk).slug == "support"


def test_the_same_slug_in_another_tenant_is_free(world, other_world, all_tenants_scope):
    mine = _create(world.client(admin=True), RouteEntryFactory(tenant=world.tenant).route, name="Helper")
    theirs = _create(other_world.client(admin=True), RouteEntryFactory(tenant=other_world.tenant).route,
                     name="Helper", slug="helper")
    assert mine.status_code == 201 and theirs.status_code == 201
    assert mine.json()["slug"] == theirs.json()["slug"] == "helper"


def test_rows_made_without_full_clean_get_a_slug(world, all_tenants_scope):
    first = AgentFactory(tenant=world.tenant, name="Researcher")
    second = AgentFactory(tenant=world.tenant, name="researcher ")
    assert (first.slug, second.slug) == ("researcher", "researcher-2")


def test_members_see_the_slug_in_the_agent_list(world, all_tenants_scope):
    AgentFactory(tenant=world.tenant, name="Docs assistant")
    listed = world.client().get("/api/v1/agents/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [(a["name"], a["slug"]) for a in rows] == [("Docs assistant", "docs-assistant")]


def test_console_shows_and_checks_the_slug(client, world, all_tenants_scope):
    route = RouteEntryFactory(tenant=world.tenant).route
    AgentFactory(tenant=world.tenant, name="Existing", slug="taken", route=route)
    client.force_login(world.admin)
    assert "taken" in client.get("/admin/agents/agentinstance/").content.decode()
    form = client.get("/admin/agents/agentinstance/add/").content.decode()
    assert 'name="slug"' in form
    data = {
        "name": "Console agent", "slug": "taken", "description": "", "system_prompt": "hi", "route": route.pk,
        "max_loop_count": 16, "tool_max_parallel": 3, "tool_timeout_seconds": 60, "turn_timeout_seconds": 300,
        "run_timeout_seconds": 1800, "message_mode": "queue", "is_active": "on",
        "bindings-TOTAL_FORMS": 0, "bindings-INITIAL_FORMS": 0, "bindings-MIN_NUM_FORMS": 0,
        "bindings-MAX_NUM_FORMS": 1000,
    }
    refused = client.post("/admin/agents/agentinstance/add/", data)
    assert refused.status_code == 200 and "has the slug" in refused.content.decode()
    data["name"] = "Existing"
    data["slug"] = ""
    refused = client.post("/admin/agents/agentinstance/add/", data)
    assert refused.status_code == 200 and "is called" in refused.content.decode()
    data["name"] = "Console agent"
    saved = client.post("/admin/agents/agentinstance/add/", data)
    assert saved.status_code == 302
    assert AgentInstance.all_tenants.get(name="Console agent").slug == "console-agent"


def test_migration_fills_existing_agents(world, all_tenants_scope):
    """The data step of 0006 gives every existing agent a slug, unique per tenant."""
    first = AgentFactory(tenant=world.tenant, name="Same name")
    second = AgentFactory(tenant=world.tenant, name="Same  name")
    migration = importlib.import_module("agents.migrations.0006_agent_slug")
    with connection.cursor() as cursor:  # slugs the step does not keep (blank ones would clash)
        cursor.execute(f'UPDATE "{AgentInstance._meta.db_table}" SET "slug" = %s || "id"', ["tmp-"])
    migration._fill_slugs(django_apps, None)
    assert {AgentInstance.all_tenants.get(pk=a.pk).slug for a in (first, second)} == {"same-name", "same-name-2"}


def _snippets(page: str) -> dict[str, str]:
    """The text of the agent page's copyable snippets, by protocol ("openai", "mcp", "a2a")."""
    found = re.findall(r'<pre class="call-snippet" id="call-snippet-(\w+)"[^>]*>(.*?)</pre>', page, re.S)
    return {name: html.unescape(text) for name, text in found}


def test_the_agent_page_shows_how_to_call_it(client, world, all_tenants_scope):
    agent = AgentFactory(tenant=world.tenant, name="Docs assistant")
    client.force_login(world.admin)
    page = client.get(f"/admin/agents/agentinstance/{agent.pk}/change/").content.decode()
    assert 'data-testid="call-agent"' in page
    assert "http://testserver/api/openai/v1" in page and 'model="docs-assistant"' in page
    snippets = _snippets(page)
    assert set(snippets) == {"openai", "mcp", "a2a"}
    for name in snippets:  # each with its copy button (console.js copies the element it names)
        assert f'data-copy="call-snippet-{name}" data-testid="call-copy-{name}"' in page
    # MCP: the agents' server, the bearer header; the tool is the slug.
    assert json.loads(snippets["mcp"]) == {"mcpServers": {"agent-platform-agents": {
        "type": "http", "url": "http://testserver/mcp/agents/", "headers": {"Authorization": "Bearer <API token>"}}}}
    assert '<code data-testid="call-mcp-tool">docs-assistant</code>' in page
    # A2A: the card and JSON-RPC URLs, and a curl SendMessage whose body the a2a-sdk's own types accept.
    assert "http://testserver/a2a/docs-assistant/.well-known/agent-card.json</code>" in page
    assert '<code data-testid="call-a2a-jsonrpc">http://testserver/a2a/docs-assistant/</code>' in page
    words = shlex.split(snippets["a2a"].replace("\\\n", " "))
    assert words[:3] == ["curl", "-s", "http://testserver/a2a/docs-assistant/"]
    headers = [words[i + 1] for i, word in enumerate(words) if word == "-H"]
    assert {"Authorization: Bearer <API token>", "A2A-Version: 1.0", "Content-Type: application/json"} == set(headers)
    body = json.loads(words[words.index("-d") + 1])
    assert (body["jsonrpc"], body["method"]) == ("2.0", "SendMessage")
    request = json_format.ParseDict(body["params"], SendMessageRequest())
    assert request.message.role == Role.ROLE_USER and request.message.parts[0].text == "Hello"
    assert 'data-testid="call-agent"' not in client.get("/admin/agents/agentinstance/add/").content.decode()
