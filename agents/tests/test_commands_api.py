"""An agent's slash commands over the API (issue 37): the tenant's commands bound to the agent
(kind ``command``) and its MCP servers' prompts listed together; rendering each (``$ARGUMENTS``
and named arguments; ``prompts/get`` with an image as an attachment); a missing required
argument is a 400 naming it; completions; another tenant's agent is a 404.

The worker's part runs in-process here (its request function called directly, on a fresh
event loop); the Celery round trip is tested in ``test_tasks_without_scope.py`` and end to end
in the Chromium test (``frontend/tests/test_chat_commands.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory
from agents.versions import version_publish
from capabilities.commands.models import Command
from capabilities.commands.worker import mcp_prompts_answer
from capabilities.models import McpServer
from capabilities.tests.prompts_test_server import PNG_BYTES, RunningPromptsServer, serve_prompts

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

TRANSLATE = "Translate into $language:\n\n$ARGUMENTS"


@pytest.fixture
def in_process(monkeypatch) -> list[dict[str, Any]]:
    """The worker's answer made in this thread (no Celery), each MCP request on a fresh loop."""
    seen: list[dict[str, Any]] = []

    def answer(*, tenant_id: int, user_id: int | None, request: dict[str, Any], wait_seconds=None) -> dict[str, Any]:
        seen.append(request)
        return mcp_prompts_answer(tenant_id=tenant_id, user_id=user_id, request=request)

    monkeypatch.setattr("agents.commands.mcp_prompts_request", answer)
    monkeypatch.setattr("capabilities.mcp_worker._runner", None)  # a fresh loop, not the run host's
    return seen


@pytest.fixture
def prompts_server() -> Iterator[RunningPromptsServer]:
    with serve_prompts() as server:
        yield server


def _agent_with_commands(tenant, url: str):
    agent = AgentFactory(tenant=tenant, name="Writer")
    server = McpServer.all_tenants.create(tenant=tenant, name="Docs", alias="docs", transport="streamable_http",
                                          url=url, connect_timeout_seconds=10)
    CapabilityBinding.all_tenants.create(tenant=tenant, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server)
    translate = Command.all_tenants.create(
        tenant=tenant, name="translate", description="Translate a text.", template=TRANSLATE,
        arguments=[{"name": "language", "description": "Into which language.", "required": True}])
    binding = CapabilityBinding(tenant=tenant, agent=agent, kind="command", config={"command": translate.pk})
    binding.full_clean()
    binding.save()
    return agent


def test_the_list_has_tenant_commands_and_mcp_prompts(world, in_process, prompts_server):
    agent = _agent_with_commands(world.tenant, prompts_server.url)
    Command.all_tenants.create(tenant=world.tenant, name="unbound", template="not listed")
    resp = world.client().get(f"/api/v1/agents/{agent.pk}/commands/")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    first, review = body["commands"][0], body["commands"][1]
    assert first == {"name": "translate", "title": "", "description": "Translate a text.", "source": "tenant",
                     "server": None, "prompt": None, "arguments": [
                         {"name": "language", "description": "Into which language.", "required": True},
                         {"name": "ARGUMENTS", "description": "Free text after the command.", "required": False}]}
    assert review == {"name": "docs:review", "title": "Code review", "description": "Review a piece of code.",
                      "source": "mcp", "server": "docs", "prompt": "review", "arguments": [
                          {"name": "code", "description": "The code to review.", "required": True},
                          {"name": "language", "description": "Its programming language.", "required": False}]}
    assert len(body["commands"]) == 1 + 14 and body["unavailable"] == []
    assert "unbound" not in [c["name"] for c in body["commands"]]


def test_a_tenant_command_is_rendered_and_a_missing_argument_named(world, in_process, prompts_server):
    agent = _agent_with_commands(world.tenant, prompts_server.url)
    url = f"/api/v1/agents/{agent.pk}/commands/translate/render/"
    client = world.client()
    resp = client.post(url, {"arguments": {"language": "German", "ARGUMENTS": "Good morning"}}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"name": "translate", "source": "tenant", "text": "Translate into German:\n\nGood morning",
                           "description": "Translate a text.", "messages": [], "attachments": []}
    resp = client.post(url, {"arguments": {"ARGUMENTS": "Good morning"}}, format="json")
    assert resp.status_code == 400
    assert resp.json() == {"message": "Missing required argument: 'language'.",
                           "extra": {"missing": ["language"], "unknown": []}}
    assert client.post(url, {"arguments": {"colour": "red", "language": "x"}}, format="json").json()["extra"][
        "unknown"] == ["colour"]
    assert client.post(f"/api/v1/agents/{agent.pk}/commands/nope/render/", {}, format="json").status_code == 404
    assert in_process == [], "a tenant command needs no worker"


def test_an_mcp_prompt_is_got_with_its_image_and_a_missing_argument_named(world, in_process, prompts_server):
    agent = _agent_with_commands(world.tenant, prompts_server.url)
    client = world.client()
    resp = client.post(f"/api/v1/agents/{agent.pk}/commands/docs:review/render/",
                       {"arguments": {"code": "print(1)", "language": "python"}}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["text"] == "Review this python code:\n\nprint(1)" and resp.json()["source"] == "mcp"
    resp = client.post(f"/api/v1/agents/{agent.pk}/commands/docs:review/render/",
                       {"arguments": {"language": "python"}}, format="json")
    assert resp.status_code == 400 and resp.json()["message"] == "Missing required argument: 'code'."
    assert prompts_server.state.gets == [("review", {"code": "print(1)", "language": "python"})], (
        "the missing argument is refused before the server is asked")
    picture = client.post(f"/api/v1/agents/{agent.pk}/commands/docs:picture/render/", {}, format="json").json()
    assert picture["text"].startswith("User: What is in this picture?") and picture["text"].endswith(
        "Assistant: I will look closely.")
    [image] = picture["attachments"]
    assert image["filename"] == "picture-1.png" and image["mime_type"] == "image/png"
    assert [m["role"] for m in picture["messages"]] == ["user", "user", "user", "assistant"]
    assert client.post(f"/api/v1/agents/{agent.pk}/commands/docs:nope/render/", {}, format="json").status_code == 404
    assert client.post(f"/api/v1/agents/{agent.pk}/commands/other:review/render/", {}, format="json").status_code == 404
    assert PNG_BYTES


def test_completions_come_from_the_server(world, in_process, prompts_server):
    agent = _agent_with_commands(world.tenant, prompts_server.url)
    client = world.client()
    resp = client.get(f"/api/v1/agents/{agent.pk}/commands/docs:review/complete/",
                      {"argument": "language", "value": "r", "context": '{"code": "x"}'})
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"values": ["ruby", "rust"], "has_more": False}
    assert prompts_server.state.completions == [("language", "r", {"code": "x"})]
    resp = client.get(f"/api/v1/agents/{agent.pk}/commands/translate/complete/", {"argument": "language", "value": "G"})
    assert resp.json() == {"values": [], "has_more": False}
    resp = client.get(f"/api/v1/agents/{agent.pk}/commands/docs:review/complete/", {"argument": "colour"})
    assert resp.status_code == 400 and "no argument 'colour'" in resp.json()["message"]
    resp = client.get(f"/api/v1/agents/{agent.pk}/commands/docs:review/complete/", {"argument": "code", "context": "{"})
    assert resp.status_code == 400


def test_the_chat_lists_what_the_published_version_binds(world, in_process):
    agent = AgentFactory(tenant=world.tenant)
    first = Command.all_tenants.create(tenant=world.tenant, name="first", template="one")
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind="command", config={"command": first.pk})
    from agents.versions import version_record

    version_record(agent)
    version_publish(agent)
    later = Command.all_tenants.create(tenant=world.tenant, name="later", template="two")
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind="command", config={"command": later.pk})
    version_record(agent)
    names = [c["name"] for c in world.client().get(f"/api/v1/agents/{agent.pk}/commands/").json()["commands"]]
    assert names == ["first"], "the draft's new binding waits for a publish"
    version_publish(agent)
    names = [c["name"] for c in world.client().get(f"/api/v1/agents/{agent.pk}/commands/").json()["commands"]]
    assert names == ["first", "later"]


def test_another_tenants_agent_and_command_are_not_found(world, other_world, in_process):
    theirs = AgentFactory(tenant=other_world.tenant)
    command = Command.all_tenants.create(tenant=other_world.tenant, name="secret", template="secret")
    CapabilityBinding.all_tenants.create(tenant=other_world.tenant, agent=theirs, kind="command",
                                         config={"command": command.pk})
    client = world.client()
    for resp in (client.get(f"/api/v1/agents/{theirs.pk}/commands/"),
                 client.post(f"/api/v1/agents/{theirs.pk}/commands/secret/render/", {}, format="json"),
                 client.get(f"/api/v1/agents/{theirs.pk}/commands/secret/complete/", {"argument": "x"})):
        assert resp.status_code == 404 and resp.json() == {"message": "Agent not found.", "extra": {}}
    mine = AgentFactory(tenant=world.tenant)
    binding = CapabilityBinding(tenant=world.tenant, agent=mine, kind="command", config={"command": command.pk})
    with pytest.raises(Exception, match="Command not found"):
        binding.full_clean()


def test_unreachable_and_unconnected_servers_are_named_and_the_rest_listed(world, in_process, prompts_server):
    from capabilities.tests.mcp_test_server import free_closed_port

    agent = _agent_with_commands(world.tenant, prompts_server.url)
    for alias, fields in (("down", {"url": f"http://127.0.0.1:{free_closed_port()}/mcp", "connect_timeout_seconds": 3}),
                          ("mine", {"url": prompts_server.url, "auth_mode": "oauth_user"})):
        server = McpServer.all_tenants.create(tenant=world.tenant, name=alias, alias=alias, transport="streamable_http",
                                              **fields)
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                             mcp_server=server)
    body = world.client().get(f"/api/v1/agents/{agent.pk}/commands/").json()
    assert len(body["commands"]) == 1 + 14
    errors = {u["server"]: u["error"] for u in body["unavailable"]}
    assert set(errors) == {"down", "mine"}
    assert "Could not connect" in errors["down"] and "You have not connected 'mine' yet" in errors["mine"]
    resp = world.client().post(f"/api/v1/agents/{agent.pk}/commands/mine:review/render/", {}, format="json")
    assert resp.status_code == 503 and "Settings → Connections" in resp.json()["message"]


def test_no_worker_in_time_is_a_503_and_the_tenant_commands_stay_listed(world, monkeypatch, prompts_server):
    agent = _agent_with_commands(world.tenant, prompts_server.url)
    monkeypatch.setattr("agents.commands.mcp_prompts_request", lambda **_: {
        "error": "No worker answered within 20 s: is a Celery worker running?", "code": "no_worker"})
    body = world.client().get(f"/api/v1/agents/{agent.pk}/commands/").json()
    assert [c["name"] for c in body["commands"]] == ["translate"]
    assert body["unavailable"] == [{"server": "docs", "error": "No worker answered within 20 s: is a Celery worker "
                                                              "running?"}]
    resp = world.client().post(f"/api/v1/agents/{agent.pk}/commands/docs:review/render/",
                               {"arguments": {"code": "x"}}, format="json")
    assert resp.status_code == 503 and resp.json()["extra"] == {"code": "no_worker"}
