"""An in-test MCP server over Streamable HTTP, built on the mcp SDK 2.x low-level ``Server``.

Served by uvicorn in a background thread on 127.0.0.1 (a free port), or over stdio with
``python -m capabilities.tests.mcp_test_server`` (for the environment tests). Tools:

- ``echo(text)``: returns the text as a text block.
- ``structured(a, b)``: returns only structuredContent ``{"sum": a + b, "inputs": [a, b]}``.
- ``fail(reason)``: returns ``isError`` with the reason as text.
- ``hang()``: never returns (until cancelled; counts cancellations).
- ``barrier(n, index)``: waits until ``n`` barrier calls are in flight at once, then returns
  ``index``; proves calls on one connection really run concurrently (times out after 10 s).
- ``media()``: an image, an audio clip and an embedded text resource.
- ``whoami()``: echoes the request's ``X-Test-Token`` header.
- ``getenv(name)``: the server process's environment variable (``<unset>`` if missing).
- ``filler_NN``: 25 do-nothing tools, so ``tools/list`` has 3 pages of 10.
"""

from __future__ import annotations

import base64
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

PAGE_SIZE = 10
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\x00" * 92  # 100 bytes, not a real picture
WAV_BYTES = b"RIFF" + b"\x00" * 46  # 50 bytes


def _tool(name: str, description: str, properties: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema={"type": "object", "properties": properties or {}},
    )


TOOLS: list[types.Tool] = [
    _tool("echo", "Echo the text back.", {"text": {"type": "string"}}),
    _tool("structured", "Add two numbers, structured result.", {"a": {"type": "number"}, "b": {"type": "number"}}),
    _tool("fail", "Always fails with the given reason.", {"reason": {"type": "string"}}),
    _tool("hang", "Never returns."),
    _tool("barrier", "Wait for n concurrent calls.", {"n": {"type": "integer"}, "index": {"type": "integer"}}),
    _tool("media", "Return an image, audio and a resource."),
    _tool("whoami", "Echo the X-Test-Token request header."),
    _tool("getenv", "Read an environment variable of the server.", {"name": {"type": "string"}}),
    *[_tool(f"filler_{i:02d}", f"Filler tool number {i}.") for i in range(25)],
]


@dataclass
class ServerState:
    """What the test server saw; read by the tests after awaiting the calls."""

    hang_started: int = 0
    hang_cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when a ``hang`` call was cancelled (the client's courtesy cancel reached us)."""
    list_cursors: list[str | None] = field(default_factory=list)
    _barrier_in_flight: int = 0
    _barrier_event: anyio.Event | None = None

    async def barrier(self, n: int) -> None:
        # The server runs in one event loop (uvicorn's thread), so no lock is needed.
        if self._barrier_event is None:
            self._barrier_event = anyio.Event()
        event = self._barrier_event
        self._barrier_in_flight += 1
        if self._barrier_in_flight >= n:
            event.set()
        with anyio.fail_after(10):
            await event.wait()


def build_server(state: ServerState) -> Server[Any]:
    """The low-level MCP server, with paginated ``tools/list``."""

    async def on_list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        state.list_cursors.append(cursor)
        start = int(cursor) if cursor else 0
        page = TOOLS[start : start + PAGE_SIZE]
        next_start = start + PAGE_SIZE
        return types.ListToolsResult(
            tools=page, next_cursor=str(next_start) if next_start < len(TOOLS) else None
        )

    async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "echo":
            return types.CallToolResult(content=[types.TextContent(text=str(args.get("text", "")))])
        if params.name == "structured":
            a, b = args["a"], args["b"]
            return types.CallToolResult(content=[], structured_content={"sum": a + b, "inputs": [a, b]})
        if params.name == "fail":
            return types.CallToolResult(
                content=[types.TextContent(text=f"failed: {args.get('reason', '')}")], is_error=True
            )
        if params.name == "hang":
            state.hang_started += 1
            try:
                await anyio.sleep_forever()
            finally:
                state.hang_cancelled.set()
        if params.name == "barrier":
            await state.barrier(int(args["n"]))
            return types.CallToolResult(content=[types.TextContent(text=str(args["index"]))])
        if params.name == "media":
            return types.CallToolResult(
                content=[
                    types.ImageContent(data=base64.b64encode(PNG_BYTES).decode(), mime_type="image/png"),
                    types.AudioContent(data=base64.b64encode(WAV_BYTES).decode(), mime_type="audio/wav"),
                    types.EmbeddedResource(
                        resource=types.TextResourceContents(
                            uri="file:///notes.txt", mime_type="text/plain", text="hello notes"
                        )
                    ),
                ]
            )
        if params.name == "whoami":
            request = ctx.request
            token = request.headers.get("x-test-token", "") if request is not None else ""
            return types.CallToolResult(content=[types.TextContent(text=token)])
        if params.name == "getenv":
            return types.CallToolResult(content=[types.TextContent(text=os.environ.get(args["name"], "<unset>"))])
        if params.name.startswith("filler_"):
            return types.CallToolResult(content=[types.TextContent(text="ok")])
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")

    return Server("capabilities-test-server", version="1.0", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


@dataclass
class RunningServer:
    url: str
    state: ServerState
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        """Shut the server down (blocking; open streams get up to 2 s to finish)."""
        self._server.should_exit = True
        self._thread.join(timeout=10)


@contextmanager
def serve_mcp_http() -> Iterator[RunningServer]:
    """Run the test server on 127.0.0.1:<free port> in a background thread.

    The listening socket is bound and listening before the thread starts, so clients can
    connect immediately (the kernel queues them until uvicorn accepts): no polling needed.

    Yields:
        RunningServer(url="http://127.0.0.1:<port>/mcp", state).
    """
    state = ServerState()
    app = build_server(state).streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="mcp-test-server", daemon=True)
    thread.start()
    try:
        yield RunningServer(url=f"http://127.0.0.1:{port}/mcp", state=state, _server=server, _thread=thread)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def free_closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) but never answers: a hung server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def main_stdio() -> None:
    """Serve the same tools over stdio (one connection, until stdin closes)."""
    server = build_server(ServerState())

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main_stdio()
