"""The knowledge MCP server (/mcp/knowledge/) shares nothing slow with the rest of the web
process (issue 34): one tenant's slow ``knowledge_search`` does not stall another tenant's
WebSocket handshake or MCP calls (the server's blocking work ran on the one thread that
Channels' ``database_sync_to_async`` uses for every WebSocket's authentication), and failed
logins are throttled per client address. On the real ASGI app (uvicorn), through the platform's
own MCP client and a real WebSocket client."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import websockets
from django.core.cache import cache

from agents.tests.factories import agent_with_route
from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from knowledge.tests import builders
from knowledge.tests.fake_embedder import fake_embedding
from sessions.services import chat_session_create
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("all_tenants_scope"),
]

SLOW_SECONDS = 3.0
"""How long the slow embeddings endpoint takes to answer."""
FAST_SECONDS = 1.0
"""What another tenant's handshake or MCP listing may take meanwhile (0.2 s and 0.06 s alone)."""


@dataclass
class SlowEmbedder:
    """An OpenAI-style embeddings endpoint that answers after ``delay`` seconds; ``received`` is
    set when a request has arrived."""

    base_url: str
    delay: float
    received: threading.Event = field(default_factory=threading.Event)


@contextlib.contextmanager
def slow_embedder(delay: float) -> Iterator[SlowEmbedder]:
    state = SlowEmbedder(base_url="", delay=delay)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            state.received.set()
            time.sleep(state.delay)
            data = [{"object": "embedding", "index": i, "embedding": fake_embedding(body["model"], t)}
                    for i, t in enumerate(texts)]
            raw = json.dumps({"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _config(live_server_url: str, token: str) -> McpServerConfig:
    return McpServerConfig(alias="kb", transport="streamable_http", url=f"{live_server_url}/mcp/knowledge/",
                           headers={"Authorization": f"Bearer {token}"}, connect_timeout_seconds=20.0)


def test_a_slow_search_does_not_stall_another_tenants_websocket_or_mcp_calls(world, other_world, live_server_url):
    with slow_embedder(SLOW_SECONDS) as slow:
        builders.knowledge_base(world.tenant, "My slow notes", owner=world.member, base_url=slow.base_url)
        agent = agent_with_route(tenant=other_world.tenant, base_urls=["http://127.0.0.1:9/v1"])
        with tenant_scope(other_world.tenant.pk):
            session = chat_session_create(user=other_world.member, agent=agent)
        ws_url = (live_server_url.replace("http://", "ws://")
                  + f"/ws/sessions/{session.pk}/?token={other_world.member_token}")

        async def slow_search():
            async with McpConnection(_config(live_server_url, world.member_token)) as connection:
                return await connection.call_tool("knowledge_search", {"query": "moorings"}, timeout_seconds=60)

        async def go():
            started = time.monotonic()
            search = asyncio.create_task(slow_search())
            assert await asyncio.to_thread(slow.received.wait, 20), "the search never asked for its embedding"
            await asyncio.sleep(0.2)  # the search now waits for the embedding in the MCP server's thread

            t0 = time.monotonic()
            async with websockets.connect(ws_url, open_timeout=15):
                handshake = time.monotonic() - t0
            t0 = time.monotonic()
            async with McpConnection(_config(live_server_url, other_world.member_token)) as connection:
                tools = await connection.list_tools()
            listing = time.monotonic() - t0
            in_flight = not search.done()
            found = await search
            return handshake, listing, in_flight, [tool.name for tool in tools], found, time.monotonic() - started

        handshake, listing, in_flight, tools, found, search_seconds = asyncio.run(go())

    assert tools == ["knowledge_bases", "knowledge_search"]
    assert found.data == {"hits": [], "notice": ""}  # the knowledge base has no documents
    assert search_seconds >= SLOW_SECONDS
    assert handshake < FAST_SECONDS, f"another tenant's WebSocket handshake took {handshake:.2f} s"
    assert listing < FAST_SECONDS, f"another tenant's MCP tools/list took {listing:.2f} s"
    assert in_flight, "the slow search had ended before the other tenant's calls were measured"


@pytest.fixture
def failed_login_budget(settings):
    """At most 3 failed logins per client address and minute; the test's address starts clean."""
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "mcp_auth.ip": "3/minute"}
    cache.delete("throttle_mcp_auth_ip_127.0.0.1")
    yield
    cache.delete("throttle_mcp_auth_ip_127.0.0.1")


def test_failed_logins_are_throttled_per_client_address(world, live_server_url, failed_login_budget):
    url = f"{live_server_url}/mcp/knowledge/"
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    good = {**headers, "Authorization": f"Bearer {world.member_token}"}
    bad = {**headers, "Authorization": "Bearer ap_nottoken"}

    # Successful logins spend nothing.
    for _ in range(5):
        assert httpx.post(url, json=listing, headers=good).status_code == 200
    assert [httpx.post(url, json=listing, headers=bad).status_code for _ in range(3)] == [401, 401, 401]
    assert httpx.post(url, json=listing, headers={**headers}).status_code == 401  # no token: nothing tried
    refused = httpx.post(url, json=listing, headers=bad)
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["message"].startswith("Too many failed logins from this address")
    # Refused before the token is looked at: a guessed right token gains nothing from this address.
    again = httpx.post(url, json=listing, headers=good)
    assert again.status_code == 429

    cache.delete("throttle_mcp_auth_ip_127.0.0.1")  # the window has passed
    assert httpx.post(url, json=listing, headers=good).status_code == 200


def test_one_tenant_runs_at_most_searches_per_tenant_searches_at_once(world, other_world, live_server_url,
                                                                       monkeypatch):
    """The threads are bounded, so one tenant must not take them all: its search beyond
    ``SEARCHES_PER_TENANT`` is refused at once (a tool error); another tenant's still runs."""
    from capabilities.tools import ToolError
    from knowledge.tests import fake_embedder

    monkeypatch.setattr("knowledge.mcp_server.SEARCHES_PER_TENANT", 1)
    with slow_embedder(SLOW_SECONDS) as slow, fake_embedder.running() as fast:
        builders.knowledge_base(world.tenant, "Slow handbook", base_url=slow.base_url)
        builders.knowledge_base(other_world.tenant, "Handbook", base_url=fast.base_url)

        async def search(token: str):
            async with McpConnection(_config(live_server_url, token)) as connection:
                return await connection.call_tool("knowledge_search", {"query": "moorings"}, timeout_seconds=60)

        async def go():
            first = asyncio.create_task(search(world.member_token))
            assert await asyncio.to_thread(slow.received.wait, 20), "the search never asked for its embedding"
            t0 = time.monotonic()
            with pytest.raises(ToolError) as refused:
                await search(world.admin_token)  # another user of the same tenant
            refused_after = time.monotonic() - t0
            t0 = time.monotonic()
            other = await search(other_world.member_token)
            other_after = time.monotonic() - t0
            in_flight = not first.done()
            found = await first
            again = await search(world.admin_token)  # the slot is free again
            return found, str(refused.value), refused_after, other, other_after, in_flight, again

        first, refusal, refused_after, other, other_after, in_flight, again = asyncio.run(go())

    assert refusal.endswith("Too many searches of this organisation are running (at most 1 at once): try again "
                            "when one has finished."), refusal
    assert refused_after < FAST_SECONDS and other_after < FAST_SECONDS
    assert in_flight
    assert first.data == other.data == again.data == {"hits": [], "notice": ""}
