"""MCP resources pinned to a chat (issue 37): ``/api/v1/sessions/<id>/pinned-resources/`` (400s
that say what is wrong; another user's or tenant's chat: 404), every later run of the chat
carrying its pins and reading them when it starts, and, against an in-test server that
declares ``resources.subscribe`` (both protocol revisions), the next run reading only the pin
the server said was updated (reads counted on the server).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from asgiref.sync import sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.services import mcp_server_save
from capabilities.tests.pins_mcp_server import URI_A, URI_B, serve_pins
from llm.testing import Reply
from sessions.models import PinnedResource, Run
from sessions.runner.loop import execute_run
from sessions.services import chat_session_create, message_post
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture(autouse=True)
async def close_the_mcp_pool():
    yield
    await mcp_pool().aclose()


def _chat(world, *, llm_url: str = "http://127.0.0.1:9/v1", mcp_url: str = "http://127.0.0.1:9/mcp", user=None):
    agent = agent_with_route(tenant=world.tenant, base_urls=[llm_url])
    server = mcp_server_save(tenant=world.tenant, env=None, name="Pins", alias="pins", transport="streamable_http",
                             url=mcp_url)
    binding = CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                                   mcp_server=server)
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=user or world.member, agent=agent)
    return binding, session


@pytest.mark.django_db
@pytest.mark.usefixtures("no_enqueue")
def test_pin_list_and_unpin(world):
    binding, session = _chat(world)
    client = world.client()
    url = f"/api/v1/sessions/{session.pk}/pinned-resources/"
    created = client.post(url, {"server": "pins", "uri": URI_A}, format="json")
    assert created.status_code == 201, created.json()
    pin = created.json()
    assert pin == {"id": pin["id"], "server": "pins", "server_id": binding.mcp_server_id, "binding": binding.pk,
                   "uri": URI_A, "bound": True, "updated": False, "created_at": pin["created_at"]}
    again = client.post(url, {"binding": binding.pk, "uri": URI_A}, format="json")
    assert again.status_code == 200 and again.json()["id"] == pin["id"], "pinning it again answers the pin"
    assert client.post(url, {"binding": binding.pk, "uri": URI_B}, format="json").status_code == 201
    assert [p["uri"] for p in client.get(url).json()["results"]] == [URI_A, URI_B]

    with tenant_scope(world.tenant.pk):
        run = message_post(session=session, user=world.member, content="What changed?")
    assert run.request_options == {"resources": [
        {"binding": binding.pk, "server_id": binding.mcp_server_id, "server": "pins", "uri": URI_A, "pinned": True},
        {"binding": binding.pk, "server_id": binding.mcp_server_id, "server": "pins", "uri": URI_B, "pinned": True},
    ]}, "a new run carries the chat's pins"

    assert client.delete(f"{url}{pin['id']}/").status_code == 204
    gone = client.delete(f"{url}{pin['id']}/")
    assert gone.status_code == 404 and gone.json() == {"message": "Pinned resource not found.", "extra": {}}
    assert [p["uri"] for p in client.get(url).json()["results"]] == [URI_B]

    CapabilityBinding.all_tenants.filter(pk=binding.pk).update(enabled=False)
    [left] = client.get(url).json()["results"]
    assert (left["uri"], left["bound"], left["binding"]) == (URI_B, False, None)
    with tenant_scope(world.tenant.pk):
        run = message_post(session=session, user=world.member, content="And now?")
    assert run.request_options is None, "a pin whose server is no longer bound is left out of runs"


@pytest.mark.django_db
def test_bad_pins_are_400s_that_say_why(world):
    binding, session = _chat(world)
    client = world.client()
    url = f"/api/v1/sessions/{session.pk}/pinned-resources/"
    bad = [
        ({"server": "nope", "uri": URI_A}, "Server 'nope' is not an MCP server of this chat's agent."),
        ({"binding": binding.pk + 1000, "uri": URI_A}, f"Binding {binding.pk + 1000!r} is not an MCP server"),
        ({"uri": URI_A}, "No server is not an MCP server of this chat's agent."),
        ({"server": "pins", "uri": "doc://" + "x" * 2000}, "The URI is longer than 2,000 characters."),
        ({"server": "pins", "uri": "notes/readme"}, "'notes/readme' is not an absolute URI."),
        ({"server": "pins", "uri": "doc://notes/{name}"}, "Fill in the template's variables"),
        ({"server": "pins"}, "uri: This field is required."),
    ]
    for body, message in bad:
        answer = client.post(url, body, format="json")
        assert answer.status_code == 400 and message in answer.json()["message"], (body, answer.json())
    for n in range(10):
        assert client.post(url, {"server": "pins", "uri": f"doc://pins/{n}"}, format="json").status_code == 201
    full = client.post(url, {"server": "pins", "uri": "doc://pins/eleven"}, format="json")
    assert full.status_code == 400 and "at most 10 pinned resources" in full.json()["message"]
    assert PinnedResource.all_tenants.filter(session=session).count() == 10


@pytest.mark.django_db
def test_another_users_or_tenants_chat_is_a_404(world, other_world):
    _, admins_chat = _chat(world, user=world.admin)
    pin = PinnedResource.all_tenants.create(tenant=world.tenant, session=admins_chat,
                                            mcp_server=CapabilityBinding.all_tenants.get(agent=admins_chat.agent)
                                            .mcp_server, uri=URI_A)
    with tenant_scope(world.tenant.pk):
        my_chat = chat_session_create(user=world.member, agent=admins_chat.agent)
    for client in (world.client(), other_world.client()):  # the chat's tenant's other member; another tenant's
        url = f"/api/v1/sessions/{admins_chat.pk}/pinned-resources/"
        for answer in (client.get(url), client.post(url, {"server": "pins", "uri": URI_B}, format="json"),
                       client.delete(f"{url}{pin.pk}/")):
            assert answer.status_code == 404 and answer.json() == {"message": "Session not found.", "extra": {}}
    stolen = world.client().delete(f"/api/v1/sessions/{my_chat.pk}/pinned-resources/{pin.pk}/")
    assert stolen.status_code == 404 and stolen.json()["message"] == "Pinned resource not found."
    assert list(PinnedResource.all_tenants.values_list("uri", flat=True)) == [URI_A], "nothing written"


async def _edit(session, uri: str, text: str) -> None:
    changed = session.resources.changed
    await session.call_tool_raw("edit", {"uri": uri, "text": text}, timeout_seconds=10)
    await asyncio.wait_for(changed.wait(), 10)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue")
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_runs_read_pins_and_only_an_updated_one_again(world, fake_llm, monkeypatch, mode):
    from capabilities import services

    config_of = services.mcp_server_config
    monkeypatch.setattr(services, "mcp_server_config",
                        lambda **kw: dataclasses.replace(config_of(**kw), protocol_mode=mode))
    with serve_pins() as mcp:
        binding, session = await sync_to_async(_chat)(world, llm_url=fake_llm.base_url, mcp_url=mcp.url)
        client = world.client()
        for uri in (URI_A, URI_B):
            answer = await sync_to_async(client.post)(f"/api/v1/sessions/{session.pk}/pinned-resources/",
                                                      {"server": "pins", "uri": uri}, format="json")
            assert answer.status_code == 201, answer.json()

        async def ask(content: str) -> Run:
            answer = await sync_to_async(client.post)(f"/api/v1/sessions/{session.pk}/messages/",
                                                      {"content": content}, format="json")
            await execute_run(answer.json()["run"]["id"])
            return await sync_to_async(Run.all_tenants.get)(pk=answer.json()["run"]["id"])

        fake_llm.script(Reply("One."), Reply("Two."), Reply("Three."))
        first = await ask("What do a and b say?")
        assert mcp.state.reads == [URI_A, URI_B]
        second = await ask("And now?")
        assert mcp.state.reads == [URI_A, URI_B], "subscribed and unchanged: not read again"

        server = await sync_to_async(lambda: binding.mcp_server)()
        pooled = mcp_pool().session(tenant_id=world.tenant.pk, server_id=server.pk,
                                    config=await sync_to_async(services.mcp_server_config)(server=server))
        await _edit(pooled, URI_A, "Version 2 of a.")
        third = await ask("Anything new?")
        assert mcp.state.reads == [URI_A, URI_B, URI_A], "only the updated pin is read again"
        pins = await sync_to_async(client.get)(f"/api/v1/sessions/{session.pk}/pinned-resources/")
        assert [(p["uri"], p["updated"]) for p in pins.json()["results"]] == [(URI_A, True), (URI_B, False)], \
            "the chat app can say which pin changed for the last answer"

    for run in (first, second, third):
        assert run.status == "completed", run.error
    assert [(b["data"]["resource"]["uri"], b["data"]["resource"]["kept"]) for b in second.context] == [
        (URI_A, True), (URI_B, True)]
    assert [(b["data"]["resource"]["uri"], b["data"]["resource"]["kept"]) for b in third.context] == [
        (URI_A, False), (URI_B, True)]
    assert [b["data"]["resource"].get("updated") for b in third.context] == [True, None]
    assert not any(b["data"]["resource"].get("updated") for b in (*first.context, *second.context))
    systems = [request["messages"][0]["content"] for request in fake_llm.requests]
    assert f"Resource {URI_A!r} of MCP server 'pins', pinned to the chat by the user:" in systems[0]
    assert "Version 1 of a." in systems[1] and "Version 1 of b." in systems[1] and "<untrusted-data" in systems[1]
    assert "Version 2 of a." in systems[2] and "Version 1 of b." in systems[2]
    assert "[resource:" not in third.input, "a pin adds no line to the message"
