"""An in-test MCP server whose resources change, for pinned resources and their subscriptions
(issue 37), built on the mcp SDK 2.x low-level ``Server`` and served over Streamable HTTP by
uvicorn in a background thread on 127.0.0.1 (both protocol revisions; the client picks).

Resources: ``doc://pins/a`` and ``doc://pins/b`` (text, ``Version 1 of a.`` at first). With
``subscribe=True`` the server declares ``resources.subscribe``: at 2025-11-25 it serves
``resources/subscribe`` and ``resources/unsubscribe`` (noting each), at 2026-07-28
``subscriptions/listen`` (``resourceSubscriptions`` honoured). Without, neither.

Tool ``edit(uri, text)``: the resource's text becomes ``text`` and the server announces
``notifications/resources/updated`` for it: to each session subscribed to it (2025-11-25; on the
request's own stream when the subscriber is the caller) and on the listen streams asking for it
(2026-07-28). :attr:`PinsState.reads` is every ``resources/read`` the server answered.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

URI_A = "doc://pins/a"
URI_B = "doc://pins/b"


@dataclass
class PinsState:
    """What the server holds and saw (read by the tests after awaiting their calls)."""

    texts: dict[str, str] = field(default_factory=lambda: {URI_A: "Version 1 of a.", URI_B: "Version 1 of b."})
    reads: list[str] = field(default_factory=list)
    """The URI of every ``resources/read``, in order."""
    subscribe_requests: list[str] = field(default_factory=list)
    """The URI of every ``resources/subscribe`` (2025-11-25)."""
    unsubscribe_requests: list[str] = field(default_factory=list)
    subscribers: dict[str, list[Any]] = field(default_factory=dict)
    """URI → the sessions subscribed to it (2025-11-25)."""
    bus: InMemorySubscriptionBus = field(default_factory=InMemorySubscriptionBus)


def _build(state: PinsState, *, subscribe: bool) -> Server[Any]:
    async def on_list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=uri.rsplit("/", 1)[1], mime_type="text/plain") for uri in state.texts])

    async def on_read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        state.reads.append(uri)
        if uri not in state.texts:
            raise MCPError(code=-32002, message=f"Resource not found: {uri}")
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="text/plain",
                                                                             text=state.texts[uri])])

    async def on_subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        state.subscribe_requests.append(str(params.uri))
        state.subscribers.setdefault(str(params.uri), []).append(ctx.session)
        return types.EmptyResult()

    async def on_unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        state.unsubscribe_requests.append(str(params.uri))
        state.subscribers.pop(str(params.uri), None)
        return types.EmptyResult()

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(
            name="edit", description="Change a resource's text.",
            input_schema={"type": "object", "properties": {"uri": {"type": "string"}, "text": {"type": "string"}},
                          "required": ["uri", "text"]})])

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        uri, text = str(args["uri"]), str(args["text"])
        state.texts[uri] = text
        for session in state.subscribers.get(uri, ()):
            note = types.ResourceUpdatedNotification(params=types.ResourceUpdatedNotificationParams(uri=uri))
            await session.send_notification(note, related_request_id=ctx.request_id if session is ctx.session else None)
        await state.bus.publish(ResourceUpdated(uri=uri))
        return types.CallToolResult(content=[types.TextContent(text="edited")])

    handlers: dict[str, Any] = {}
    if subscribe:
        handlers = {"on_subscribe_resource": on_subscribe, "on_unsubscribe_resource": on_unsubscribe,
                    "on_subscriptions_listen": ListenHandler(state.bus)}
    return Server("pins-test-server", version="1.0", on_list_resources=on_list_resources,
                  on_read_resource=on_read_resource, on_list_tools=on_list_tools, on_call_tool=on_call_tool,
                  **handlers)


@dataclass
class PinsServer:
    url: str
    state: PinsState


@contextmanager
def serve_pins(*, subscribe: bool = True) -> Iterator[PinsServer]:
    """Run the server on 127.0.0.1:<free port> in a background thread (listening before the
    thread starts: clients may connect at once).

    Yields:
        PinsServer(url="http://127.0.0.1:<port>/mcp", state).
    """
    state = PinsState()
    app = _build(state, subscribe=subscribe).streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="pins-mcp-server", daemon=True)
    thread.start()
    try:
        yield PinsServer(url=f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", state=state)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
