"""MCP client reliability against misbehaving remote servers (issue 23), and the outbound
address rules for remote MCP servers (M7). No database.

- A Streamable HTTP server that restarted answers the old session id with 400 (as the
  TypeScript SDK's servers do): the pool retires the session and retries once over a fresh
  handshake, instead of failing every call until the session idles out.
- A 401 with ``WWW-Authenticate`` keeps its status ("HTTP 401: authentication required"),
  instead of the SDK's "Server returned an error response", which reads like a 500.
- One malformed tool in a server's list is left out (and reported), not the whole server.
- A remote MCP URL on loopback/private/metadata addresses is refused at connect time unless an
  operator allowed it; a name that resolves to loopback (DNS rebinding) is refused too.
"""

from __future__ import annotations

import pytest

from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.errors import McpConnectError
from capabilities.tests.mcp_test_server import serve_mcp_http
from capabilities.tests.raw_mcp_server import RawState, serve_raw_mcp, tool
from capabilities.tools import ToolError
from llm import netrules  # the DNS seam (_getaddrinfo) lives with the address rules

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("all_tenants_scope")]


def http_config(url: str, **fields) -> McpServerConfig:
    return McpServerConfig(alias="raw", transport="streamable_http", url=url, connect_timeout_seconds=10,
                           list_timeout_seconds=10, call_timeout_seconds=10, protocol_mode="legacy", **fields)


# --- a restarted server -----------------------------------------------------------------------


async def test_a_server_that_forgot_the_session_id_gets_a_fresh_handshake_and_the_call_is_retried(pool):
    with serve_raw_mcp(RawState(tools=[tool("echo")])) as server:
        session = pool.session(tenant_id=1, server_id=1, config=http_config(server.url))
        first = await session.call_tool_raw("echo", {}, timeout_seconds=5)
        assert first.content[0].text == "echo ok" and server.state.initializes == 1

        server.state.restart()  # the server restarted: it answers our session id with 400
        second = await session.call_tool_raw("echo", {}, timeout_seconds=5)

        assert second.content[0].text == "echo ok"
        assert server.state.stale_rejections >= 1, "the old session id was tried and refused"
        assert server.state.initializes == 2, "a fresh handshake"
        third = await session.call_tool_raw("echo", {}, timeout_seconds=5)
        assert third.content[0].text == "echo ok" and server.state.initializes == 2
        assert session.breaker.state == "closed"


async def test_a_server_that_keeps_refusing_fails_after_one_retry(pool):
    with serve_raw_mcp(RawState(tools=[tool("echo")])) as server:
        session = pool.session(tenant_id=1, server_id=1, config=http_config(server.url))
        await session.call_tool_raw("echo", {}, timeout_seconds=5)
        server.state.restart()
        original_sessions = server.state.sessions
        # Every new session is forgotten at once: the retry meets a 400 again.
        server.state.sessions = type("Forgetful", (set,), {"add": lambda self, item: None})()
        with pytest.raises(ToolError):
            await session.call_tool_raw("echo", {}, timeout_seconds=5)
        assert server.state.initializes == 2, "one retry (one fresh handshake), not a loop"
        server.state.sessions = original_sessions


# --- HTTP status ------------------------------------------------------------------------------


async def test_a_401_says_authentication_required():
    with serve_raw_mcp(RawState(status=401)) as server:
        with pytest.raises(McpConnectError) as caught:
            async with McpConnection(http_config(server.url)):
                pass
    assert "HTTP 401: authentication required" in caught.value.message


async def test_a_401_through_the_pool_says_authentication_required(pool):
    with serve_raw_mcp(RawState(status=401)) as server:
        session = pool.session(tenant_id=1, server_id=1, config=http_config(server.url))
        with pytest.raises(McpConnectError) as caught:
            await session.catalogue()
    assert "HTTP 401: authentication required" in caught.value.message


# --- malformed tools --------------------------------------------------------------------------


MALFORMED = [
    tool("good"),
    {"name": "bad_schema", "inputSchema": "not an object"},
    {"description": "a tool without a name", "inputSchema": {"type": "object"}},
    tool("also_good"),
]


async def test_a_malformed_tool_is_skipped_not_the_whole_server(pool):
    with serve_raw_mcp(RawState(tools=MALFORMED)) as server:
        session = pool.session(tenant_id=1, server_id=1, config=http_config(server.url))
        catalogue = await session.catalogue()
        assert [t.name for t in catalogue.tools] == ["good", "also_good"]
        assert len(catalogue.skipped) == 2 and "'bad_schema'" in catalogue.skipped[0]
        result = await session.call_tool_raw("also_good", {}, timeout_seconds=5)
        assert result.content[0].text == "also_good ok"


async def test_a_malformed_tool_is_skipped_on_a_plain_connection():
    with serve_raw_mcp(RawState(tools=MALFORMED)) as server:
        async with McpConnection(http_config(server.url)) as conn:
            assert [t.name for t in await conn.list_tools()] == ["good", "also_good"]


# --- M7: outbound address rules for remote MCP servers --------------------------------------


@pytest.fixture
def no_internal_hosts(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = []


async def test_an_mcp_url_on_loopback_is_refused_at_connect(no_internal_hosts):
    with serve_mcp_http() as server:
        with pytest.raises(McpConnectError) as caught:
            async with McpConnection(http_config(server.url)):
                pass
        assert "loopback" in caught.value.message
        assert server.state.calls == 0


async def test_an_sse_url_on_loopback_is_refused_at_connect(no_internal_hosts):
    with serve_mcp_http(transport="sse") as server:
        config = McpServerConfig(alias="sse", transport="sse", url=server.url, connect_timeout_seconds=10)
        with pytest.raises(McpConnectError) as caught:
            async with McpConnection(config):
                pass
        assert "loopback" in caught.value.message


async def test_a_name_that_rebinds_to_loopback_is_refused_at_connect(no_internal_hosts, monkeypatch):
    async def rebinding(host, port):  # what a hostile DNS answers at connect time
        return [(2, 1, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(netrules, "_getaddrinfo", rebinding)
    with serve_mcp_http() as server:
        port = server.url.split(":")[2].split("/")[0]
        with pytest.raises(McpConnectError) as caught:
            async with McpConnection(http_config(f"http://mcp.example.com:{port}/mcp")):
                pass
        assert "resolves to 127.0.0.1" in caught.value.message and "loopback" in caught.value.message


async def test_an_operator_allowed_host_is_reached(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    with serve_mcp_http() as server:
        host_port = server.url.split("/")[2]
        settings.OUTBOUND_ALLOWED_HOSTS = [host_port]
        async with McpConnection(http_config(server.url)) as conn:
            assert any(t.name == "echo" for t in await conn.list_tools())
