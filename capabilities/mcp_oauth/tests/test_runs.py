"""OAuth MCP servers in runs on the fake model: a member who has not connected gets the run
without the server's tools and a ``capability_unavailable`` that says where to connect; once
connected, the run calls the server's tools through the pool with the connection's token."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server
from capabilities.tests.mcp_test_server import serve_mcp_http
from llm.testing import Reply, ToolCalls
from sessions.events import events_since
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
async def close_the_mcp_pool():
    yield
    await mcp_pool().aclose()


@database_sync_to_async
def _agent_with_oauth_server(world, llm_url, mcp_url, fake, *, connect_member: bool):
    agent = agent_with_route(tenant=world.tenant, base_urls=[llm_url])
    server = oauth_server(world.tenant, url=mcp_url)
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                         mcp_server=server)
    connected(server, fake, user=world.admin, expired=False)  # someone else's connection is not the member's
    if connect_member:
        server.member_connection_id = connected(server, fake, user=world.member, expired=False).pk
    return agent, server


async def test_a_member_who_has_not_connected_is_told_where_to_connect(world, fake_llm, settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with FakeAuthorizationServer() as fake, serve_mcp_http() as mcp:
        agent, server = await _agent_with_oauth_server(world, fake_llm.base_url, mcp.url, fake, connect_member=False)
        fake_llm.script(Reply("I cannot reach it."))
        run = await post_message(agent=agent, user=world.member, content="echo hi")
        await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", (run.reason, run.error)
    assert "tools" not in fake_llm.requests[0]
    events = await events_since(session_id=run.session_id, after_seq=0)
    [unavailable] = [e["data"] for e in events if e["type"] == "capability_unavailable"]
    assert unavailable["alias"] == server.alias
    assert "You have not connected" in unavailable["error"] and "Settings → Connections" in unavailable["error"]
    assert mcp.state.calls == 0


async def test_a_connected_member_calls_the_servers_tools(world, fake_llm, settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with FakeAuthorizationServer() as fake, serve_mcp_http() as mcp:
        agent, server = await _agent_with_oauth_server(world, fake_llm.base_url, mcp.url, fake, connect_member=True)
        fake_llm.script(ToolCalls([(f"{server.alias}__echo", {"text": "hi"})]), Reply("It said hi."))
        run = await post_message(agent=agent, user=world.member, content="echo hi")
        await execute_run(run.pk)
        keys = [s.config.auth_key for s in mcp_pool().sessions]
    run = await reload_run(run.pk)
    assert run.status == "completed", (run.reason, run.error)
    assert mcp.state.calls == 1 and fake.refreshes == []
    assert keys == [f"oauth:{server.member_connection_id}"]  # the member's connection, not the admin's
