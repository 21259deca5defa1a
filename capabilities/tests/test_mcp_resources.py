"""MCP resources through the pool (:mod:`capabilities.mcp.resources`) against the in-test server
over Streamable HTTP, at both protocol revisions the client speaks (2026-07-28: ``mode="auto"``;
2025-11-25: ``legacy``): every page of ``resources/list`` and the templates, cached; reads of
text and blobs, a template filled in, an unknown URI, the size cap; ``resources/list_changed``
and ``resources/updated`` making the listing stale; embedded resources and resource links in a
tool's result (blobs stored as artifacts). No database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.pool import McpPool, PooledSession
from capabilities.mcp.resources import ResourceTooLarge
from capabilities.mcp.tool import McpTool
from capabilities.tests.mcp_test_server import (
    PDF_BYTES,
    PNG_IMAGE,
    README_TEXT,
    RESOURCES,
    RunningServer,
    serve_mcp_http,
)
from capabilities.tools import ToolContext, ToolError

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def mcp_server() -> Iterator[RunningServer]:
    with serve_mcp_http() as server:
        yield server


def session_of(pool: McpPool, server: RunningServer, mode: str) -> PooledSession:
    config = McpServerConfig(alias="docs", transport="streamable_http", url=server.url, connect_timeout_seconds=10.0,
                             protocol_mode=mode)  # type: ignore[arg-type]
    return pool.session(tenant_id=1, server_id=1, config=config)


@pytest.mark.parametrize("mode,revision", [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
async def test_list_search_and_read(pool: McpPool, mcp_server: RunningServer, mode: str, revision: str) -> None:
    session = session_of(pool, mcp_server, mode)
    first, second = await asyncio.gather(session.resources.list(), session.resources.list())
    assert session.protocol_version == revision
    assert first is second is await session.resources.list(), "cached: one listing"
    assert [r.uri for r in first.resources] == [r.uri for r in RESOURCES]
    assert mcp_server.state.resource_cursors == [None, "10"], "every page, once"
    [template] = first.templates
    assert (template.uri, template.template, template.title) == ("doc://notes/{name}", True, "A note by name")
    assert [r.uri for r in first.search("PROJECT")] == ["doc://notes/readme", "doc://images/logo.png"]
    assert [r.uri for r in first.search("note by")] == ["doc://notes/{name}"]
    assert first.resources[1].as_json() == {
        "uri": "doc://images/logo.png", "name": "logo", "title": "Logo", "description": "The project's logo.",
        "mime_type": "image/png", "size": len(PNG_IMAGE), "template": False}

    [readme] = await session.resources.read("doc://notes/readme")
    [logo] = await session.resources.read("doc://images/logo.png")
    [note] = await session.resources.read("doc://notes/tuesday")  # the template, filled in
    assert (readme.text, readme.mime_type, readme.data) == (README_TEXT, "text/markdown", None)
    assert (logo.data, logo.mime_type, logo.text) == (PNG_IMAGE, "image/png", None)
    assert note.text == "Note tuesday."
    with pytest.raises(ToolError) as unknown:
        await session.resources.read("doc://nowhere")
    assert unknown.value.code == "mcp_error" and "doc://nowhere" in unknown.value.message
    with pytest.raises(ResourceTooLarge) as large:
        await session.resources.read("doc://big.txt", max_bytes=100_000)
    assert large.value.code == "resource_too_large"
    assert "300,000 bytes" in large.value.message and "100,000-byte limit" in large.value.message
    assert session.state == "ready" and session.connects == 1, "a server's error does not end the session"


@pytest.mark.parametrize("mode,transport", [("auto", "streamable_http"), ("legacy", "sse")])
async def test_list_changed_and_updated_make_the_listing_stale(pool: McpPool, mode: str, transport: str) -> None:
    with serve_mcp_http(transport=transport) as server:
        config = McpServerConfig(alias="docs", transport=transport, url=server.url, connect_timeout_seconds=10.0,
                                 protocol_mode=mode)  # type: ignore[arg-type]
        session = pool.session(tenant_id=1, server_id=1, config=config)
        before = await session.resources.list()
        changed = session.resources.changed
        await session.call_tool_raw("change_resources", {"action": "add", "name": "fresh"}, timeout_seconds=10)
        await asyncio.wait_for(changed.wait(), 10)
        after = await session.resources.list()
        assert [r.uri for r in after.resources] == [r.uri for r in before.resources] + ["doc://added/fresh"]

        if mode == "legacy":  # 2026-07-28 delivers updates only for subscribed URIs, and we subscribe to none
            changed = session.resources.changed
            await session.call_tool_raw("change_resources", {"action": "update", "name": "readme"}, timeout_seconds=10)
            await asyncio.wait_for(changed.wait(), 10)
            assert session.resources.updates == ["doc://notes/readme"]
            listed_before = server.state.resource_cursors.count(None)
            relisted = await session.resources.list()
            assert relisted is not after and server.state.resource_cursors.count(None) == listed_before + 1
        await pool.aclose()


class _Context(ToolContext):
    """A ToolContext keeping artifacts in memory (no database)."""

    def __init__(self) -> None:
        super().__init__(tenant_id=1, session_id=1, run_id=1, tool_call_id=7)
        self.artifacts: dict[int, tuple[str, str, bytes]] = {}

    async def artifact_save(self, *, name: str, mime_type: str, data: bytes) -> int:
        self.artifacts[100 + len(self.artifacts)] = (name, mime_type, data)
        return 99 + len(self.artifacts)


async def test_embedded_resources_and_links_in_a_tool_result(pool: McpPool, mcp_server: RunningServer) -> None:
    session = session_of(pool, mcp_server, "auto")
    info = next(t for t in (await session.catalogue()).tools if t.name == "resource_result")
    tool = McpTool(connection=session, info=info, exposed_name="docs__resource_result", call_timeout_seconds=10)
    context = _Context()
    result = await tool.execute({}, context)
    assert context.artifacts == {100: ("chart.png", "image/png", PNG_IMAGE),
                                 101: ("report.pdf", "application/pdf", PDF_BYTES)}
    assert result.content.splitlines() == [
        "Here is the report.",
        "[resource doc://notes/summary text/plain]",
        "Summary: all green.",
        f"[resource doc://images/chart.png: artifact:100, image/png, {len(PNG_IMAGE)} bytes]",
        f"[resource doc://files/report.pdf: artifact:101, application/pdf, {len(PDF_BYTES)} bytes]",
        '[resource link doc://notes/readme "Project readme" text/markdown]',
    ]
