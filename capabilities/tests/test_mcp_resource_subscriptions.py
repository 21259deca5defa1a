"""Pinned resources' kept contents and subscriptions (:meth:`ResourceCache.read_kept`,
:mod:`capabilities.mcp.resources`) against an in-test server whose resources change, at both
protocol revisions (2025-11-25: ``resources/subscribe`` on the pooled session; 2026-07-28:
``resourceSubscriptions`` on a ``subscriptions/listen`` stream): a subscribed resource is read
once, then answered from what the session kept until the server says it was updated; the
other one is not read again. A server without ``resources.subscribe`` is read every time.
No database.
"""

from __future__ import annotations

import asyncio

import pytest

from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.pool import McpPool, PooledSession
from capabilities.mcp.resources import ResourceTooLarge
from capabilities.tests.pins_mcp_server import URI_A, URI_B, PinsServer, serve_pins

pytestmark = [pytest.mark.timeout(60)]

MODES = [("auto", "2026-07-28"), ("legacy", "2025-11-25")]


def session_of(pool: McpPool, server: PinsServer, mode: str) -> PooledSession:
    config = McpServerConfig(alias="pins", transport="streamable_http", url=server.url, connect_timeout_seconds=10.0,
                             protocol_mode=mode)  # type: ignore[arg-type]
    return pool.session(tenant_id=1, server_id=1, config=config)


async def read_text(session: PooledSession, uri: str) -> tuple[str, bool]:
    [content], kept = await session.resources.read_kept(uri)
    return content.text or "", kept


async def edit(session: PooledSession, uri: str, text: str) -> None:
    """Change ``uri`` on the server through a tool call and wait for its ``resources/updated``."""
    changed = session.resources.changed
    await session.call_tool_raw("edit", {"uri": uri, "text": text}, timeout_seconds=10)
    await asyncio.wait_for(changed.wait(), 10)


@pytest.mark.parametrize("mode,revision", MODES)
async def test_an_update_makes_only_that_resource_read_again(pool: McpPool, mode: str, revision: str) -> None:
    with serve_pins() as server:
        session = session_of(pool, server, mode)
        await session.resources.keep([URI_A, URI_B])
        assert session.protocol_version == revision
        assert await read_text(session, URI_A) == ("Version 1 of a.", False)
        assert await read_text(session, URI_B) == ("Version 1 of b.", False)
        assert await read_text(session, URI_A) == ("Version 1 of a.", True), "kept: not asked again"
        assert await read_text(session, URI_B) == ("Version 1 of b.", True)
        assert server.state.reads == [URI_A, URI_B]
        if revision == "2025-11-25":
            assert server.state.subscribe_requests == [URI_A, URI_B]

        assert not session.resources.announced_updated(URI_A)
        await edit(session, URI_A, "Version 2 of a.")
        assert session.resources.announced_updated(URI_A) and not session.resources.announced_updated(URI_B)
        assert await read_text(session, URI_A) == ("Version 2 of a.", False), "updated: read afresh"
        assert not session.resources.announced_updated(URI_A)
        assert await read_text(session, URI_B) == ("Version 1 of b.", True), "the other one is still kept"
        assert server.state.reads == [URI_A, URI_B, URI_A]
        assert await read_text(session, URI_A) == ("Version 2 of a.", True)
        assert session.connects == 1


@pytest.mark.parametrize("mode,revision", MODES)
async def test_without_subscribe_every_read_asks_the_server(pool: McpPool, mode: str, revision: str) -> None:
    with serve_pins(subscribe=False) as server:
        session = session_of(pool, server, mode)
        await session.resources.keep([URI_A])
        for _ in range(3):
            assert await read_text(session, URI_A) == ("Version 1 of a.", False)
        assert session.protocol_version == revision
        assert server.state.reads == [URI_A] * 3 and server.state.subscribe_requests == []


async def test_kept_contents_end_with_their_connection_and_the_size_cap_still_applies(pool: McpPool) -> None:
    with serve_pins() as server:
        session = session_of(pool, server, "legacy")
        assert await read_text(session, URI_A) == ("Version 1 of a.", False), "subscribed on first use"
        assert await read_text(session, URI_A) == ("Version 1 of a.", True)
        with pytest.raises(ResourceTooLarge):
            await session.resources.read_kept(URI_A, max_bytes=5)
        await session.disconnect()
        assert await read_text(session, URI_A) == ("Version 1 of a.", False), "a new connection reads afresh"
        assert session.connects == 2 and server.state.subscribe_requests == [URI_A, URI_A]
        assert server.state.reads == [URI_A, URI_A]


async def test_what_a_session_keeps_is_bounded(pool: McpPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond ``MAX_KEPT_RESOURCES`` subscriptions the least recently used is dropped and unsubscribed."""
    from capabilities.mcp import resources

    monkeypatch.setattr(resources, "MAX_KEPT_RESOURCES", 1)
    with serve_pins() as server:
        session = session_of(pool, server, "legacy")
        assert await read_text(session, URI_A) == ("Version 1 of a.", False)
        assert await read_text(session, URI_B) == ("Version 1 of b.", False)
        assert server.state.unsubscribe_requests == [URI_A]
        assert await read_text(session, URI_B) == ("Version 1 of b.", True)
        assert await read_text(session, URI_A) == ("Version 1 of a.", False), "dropped: read (and subscribed) again"
        assert server.state.subscribe_requests == [URI_A, URI_B, URI_A]

