"""OAuth MCP servers in runs on the fake model: a member who has not connected gets the run
without the server's tools (its ``<alias>__connect`` stand-in instead, the Connect card:
sessions/tests/test_mcp_connect_card.py) and a ``capability_unavailable`` that says where to
connect; once connected, the run calls the server's tools through the pool with the
connection's token."""

from __future__ import annotations

import contextlib
import time

import pytest
from channels.db import database_sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server
from capabilities.tests.mcp_test_server import serve_mcp_http
from llm.testing import Reply, ToolCalls
from sessions.events import events_since
from sessions.runner.loop import execute_run
from sessions.runs.transitions import unattended_runs
from sessions.tests.conftest import post_message, post_message_sync, reload_run

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
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == [f"{server.alias}__connect"]
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


def _challenging(app, method: str):
    """``app`` behind a gate that answers a POST of JSON-RPC ``method`` with 401
    ``scope="files:write"`` whatever its token (a server that guards that operation only)."""
    import json

    challenge = b'Bearer error="invalid_token", scope="files:write"'

    async def gate(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        received = [await receive()]
        while received[-1].get("more_body"):
            received.append(await receive())
        body = b"".join(message.get("body", b"") for message in received)
        if json.loads(body or b"{}").get("method") == method:
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"www-authenticate", challenge), (b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"error": "invalid_token"}'})
            return
        replay = iter(received)

        async def again():
            return next(replay, None) or await receive()

        await app(scope, again, send)

    return gate


@contextlib.contextmanager
def _serve_challenging_tool_calls():
    """The test MCP server on 127.0.0.1, its ``tools/call`` answered 401 (see :func:`_challenging`)."""
    import socket
    import threading

    import uvicorn

    from capabilities.tests.mcp_test_server import ServerState, build_server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    app = _challenging(build_server(ServerState()).streamable_http_app(), "tools/call")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def test_a_401_on_a_tool_call_ends_the_call_and_asks_to_connect_again(world, fake_llm, settings):
    """A later request of the run (the tool call, after a good handshake and listing) refused
    with 401 even after a refresh, in a run nobody watches (an API run: a chat's run waits on a
    Connect card instead, sessions/tests/test_mcp_connect_card.py): the call fails at once (no
    hang, no crash: the pooled session ends with ``ConnectionRequired``, the model reads an
    error), the connection is marked ``reconnect`` asking for the 401's scope, and the next
    run leaves the server out with where to connect (the same path as a refused refresh),
    offering its ``<alias>__connect`` stand-in instead."""
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with FakeAuthorizationServer() as fake, _serve_challenging_tool_calls() as mcp_url:
        agent, server = await _agent_with_oauth_server(world, fake_llm.base_url, mcp_url, fake, connect_member=True)
        fake_llm.script(ToolCalls([(f"{server.alias}__echo", {"text": "hi"})]), Reply("I need you to connect."))
        run = await database_sync_to_async(_unattended_post)(agent, world.member, "echo hi")
        started = time.monotonic()
        await execute_run(run.pk)
        elapsed = time.monotonic() - started
        fake_llm.script(Reply("Connect it first."))
        second = await post_message(agent=agent, user=world.member, content="echo again")
        await execute_run(second.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", (run.reason, run.error)
    assert elapsed < 10, elapsed  # not the tool timeout
    tool_result = fake_llm.requests[1]["messages"][-1]
    assert tool_result["role"] == "tool" and tool_result["content"].startswith("Error:"), tool_result
    assert "closed during the call" not in tool_result["content"]  # the pool's generic text, before
    assert (f"MCP server {server.alias!r} refused the account's access during the call" in tool_result["content"]
            and "must be connected again: Settings → Connections" in tool_result["content"]), tool_result
    assert [r["refresh_token"] for r in fake.refreshes] == ["refresh-0"]  # one fresh token tried first
    connection = await database_sync_to_async(McpOAuthConnection.all_tenants.get)(pk=server.member_connection_id)
    assert connection.status == ConnectionStatus.RECONNECT
    assert connection.requested_scope == "read files:write"
    events = await events_since(session_id=second.session_id, after_seq=0)
    unavailable = [e["data"] for e in events if e["type"] == "capability_unavailable"]
    assert [u["alias"] for u in unavailable][-1:] == [server.alias]
    assert "has to be made again" in unavailable[-1]["error"] and "Settings → Connections" in unavailable[-1]["error"]
    assert [t["function"]["name"] for t in fake_llm.requests[2]["tools"]] == [f"{server.alias}__connect"]


def _unattended_post(agent, user, content):
    with unattended_runs():
        return post_message_sync(agent=agent, user=user, content=content)
