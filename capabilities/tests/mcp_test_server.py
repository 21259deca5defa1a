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
- ``progress(steps)``: sends ``steps`` progress notifications (``step i of n``), returns ``done``.
- ``add_tool(name)``: adds a tool ``name`` to the list and notifies the client
  (``notifications/tools/list_changed``: a plain notification on handshake-era connections, a
  ``subscriptions/listen`` event on 2026-07-28 ones).
- ``crash()``: the server process exits at once (stdio; over HTTP it only drops the server's
  half of this call; tests crash the HTTP server with ``RunningServer.crash()``).
- ``pid()``: the server process id.
- ``sleep_echo(text, seconds)``: returns ``text`` after ``seconds``.
- ``change_resources(action, name)``: ``action`` ``add`` adds a resource ``doc://added/<name>``
  and announces ``resources/list_changed``; ``update`` announces ``resources/updated`` for
  ``doc://notes/<name>`` (each as a plain notification and a ``subscriptions/listen`` event).
- ``resource_result()``: a text block, an embedded text resource, an embedded image resource
  (:data:`PNG_IMAGE`), an embedded PDF blob and a resource link (``doc://notes/readme``).

Resources (:data:`RESOURCES`, ``resources/list`` in pages of 10: 11 of them, so 2 pages):
``doc://notes/readme`` (Markdown), ``doc://images/logo.png`` (a real 120×80 PNG),
``doc://big.txt`` (:data:`BIG_TEXT_BYTES` of text) and eight fillers; one template,
``doc://notes/{name}`` (reads as ``Note <name>.``). An unknown URI is error ``-32002``.

Env ``MCP_TEST_START_BARRIER=<dir>:<n>`` (stdio): on start, the server creates a file in
``<dir>`` and waits (up to 15 s) until ``n`` files exist: ``n`` servers connected one after the
other would never all start, so a connect that succeeds proves they were started concurrently.

Env ``MCP_TEST_START_DELAY=<seconds>`` (stdio): the server waits that long before it answers,
then notes the time in its own ``MCP_TEST_STARTED_AT`` (read it with ``getenv``). Servers
connected one after the other start at least the delay apart; concurrently, together. (Confined
servers have no shared writable directory for the barrier.)

Env ``MCP_TEST_STUBBORN=<seconds>`` (stdio): a server that does not go when told to, for the
lifecycle tests (``test_mcp_lifecycle.py``). It ignores SIGTERM, SIGINT and SIGHUP, starts a
daemon of its own (a child in a new session, ignoring the same signals, that sleeps
``<seconds>``: no process-group kill reaches it), and after its stdin closes it sleeps
``<seconds>`` instead of exiting. Only the sandbox going away (its PID namespace) ends them.

Arguments after the module name are ignored, and passed on to the daemon's command line: tests
put a unique tag there to find every process of one server in ``/proc``.
"""

from __future__ import annotations

import base64
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.sse import SseServerTransport
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError

PAGE_SIZE = 10


def _png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A real PNG of one colour (pure Python: zlib and CRCs)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * height))
            + chunk(b"IEND", b""))


PNG_IMAGE = _png(120, 80, (37, 99, 235))
"""A real 120×80 blue PNG: ``doc://images/logo.png`` and ``resource_result``'s embedded image."""
PDF_BYTES = b"%PDF-1.4\n% test\n%%EOF\n"
BIG_TEXT_BYTES = 300_000
README_TEXT = "# Readme\n\nThe launch is on **Tuesday**."
RESOURCES: list[types.Resource] = [
    types.Resource(uri="doc://notes/readme", name="readme", title="Project readme", description="How the project works.",
                   mime_type="text/markdown"),
    types.Resource(uri="doc://images/logo.png", name="logo", title="Logo", description="The project's logo.",
                   mime_type="image/png", size=len(PNG_IMAGE)),
    types.Resource(uri="doc://big.txt", name="big", description="A large text file.", mime_type="text/plain",
                   size=BIG_TEXT_BYTES),
    *[types.Resource(uri=f"doc://filler/{i}", name=f"filler-{i}", mime_type="text/plain") for i in range(8)],
]
RESOURCE_TEMPLATES = [types.ResourceTemplate(uri_template="doc://notes/{name}", name="note", title="A note by name",
                                             description="Any note, by its name.", mime_type="text/plain")]
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
    _tool("progress", "Report progress steps.", {"steps": {"type": "integer"}}),
    _tool("add_tool", "Add a tool to the list.", {"name": {"type": "string"}}),
    _tool("crash", "Exit the server process."),
    _tool("pid", "The server process id."),
    _tool("sleep_echo", "Echo text after a pause.", {"text": {"type": "string"}, "seconds": {"type": "number"}}),
    _tool("change_resources", "Add a resource or announce one updated.",
          {"action": {"type": "string"}, "name": {"type": "string"}}),
    _tool("resource_result", "Return embedded resources and a resource link."),
]


@dataclass
class ServerState:
    """What the test server saw; read by the tests after awaiting the calls."""

    hang_started: int = 0
    hang_cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when a ``hang`` call was cancelled (the client's courtesy cancel reached us)."""
    list_cursors: list[str | None] = field(default_factory=list)
    extra_tools: list[types.Tool] = field(default_factory=list)
    """Tools added at runtime with ``add_tool`` (listed after ``TOOLS``)."""
    bus: InMemorySubscriptionBus = field(default_factory=InMemorySubscriptionBus)
    calls: int = 0
    """Tool calls received (any tool)."""
    extra_resources: list[types.Resource] = field(default_factory=list)
    """Resources added at runtime with ``change_resources`` (listed after ``RESOURCES``)."""
    resource_cursors: list[str | None] = field(default_factory=list)
    """The cursor of every ``resources/list`` request."""
    reads: list[str] = field(default_factory=list)
    """The URI of every ``resources/read`` request."""
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
        tools = TOOLS + state.extra_tools
        page = tools[start : start + PAGE_SIZE]
        next_start = start + PAGE_SIZE
        return types.ListToolsResult(
            tools=page, next_cursor=str(next_start) if next_start < len(tools) else None
        )

    async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        state.calls += 1
        if params.name in ("change_resources", "resource_result"):
            return await _resource_tool(ctx, state, params.name, args)
        if params.name == "progress":
            steps = int(args.get("steps", 3))
            for i in range(1, steps + 1):
                await ctx.session.report_progress(i, steps, f"step {i} of {steps}")
            return types.CallToolResult(content=[types.TextContent(text="done")])
        if params.name == "add_tool":
            state.extra_tools.append(_tool(str(args["name"]), "Added at runtime."))
            await ctx.session.send_tool_list_changed()  # handshake era (dropped on modern connections)
            await state.bus.publish(ToolsListChanged())  # 2026-07-28 era: subscriptions/listen streams
            return types.CallToolResult(content=[types.TextContent(text="added")])
        if params.name == "crash":
            os._exit(3)
        if params.name == "sleep_echo":
            await anyio.sleep(float(args.get("seconds", 0)))
            return types.CallToolResult(content=[types.TextContent(text=str(args.get("text", "")))])
        if params.name == "pid":
            return types.CallToolResult(content=[types.TextContent(text=str(os.getpid()))])
        if any(t.name == params.name for t in state.extra_tools):
            return types.CallToolResult(content=[types.TextContent(text=f"{params.name} ok")])
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

    return Server(
        "capabilities-test-server",
        version="1.0",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
        **_resource_handlers(state),
        on_subscriptions_listen=ListenHandler(state.bus),
    )


def _resource_handlers(state: ServerState) -> dict[str, Any]:
    """``resources/list`` (pages of 10), ``resources/templates/list`` and ``resources/read``."""

    async def on_list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        cursor = params.cursor if params is not None else None
        state.resource_cursors.append(cursor)
        start = int(cursor) if cursor else 0
        resources = RESOURCES + state.extra_resources
        next_start = start + PAGE_SIZE
        return types.ListResourcesResult(resources=resources[start:next_start],
                                         next_cursor=str(next_start) if next_start < len(resources) else None)

    async def on_list_templates(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=RESOURCE_TEMPLATES)

    async def on_read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        state.reads.append(uri)
        if uri == "doc://notes/readme":
            contents: list[Any] = [types.TextResourceContents(uri=uri, mime_type="text/markdown", text=README_TEXT)]
        elif uri == "doc://images/logo.png":
            contents = [types.BlobResourceContents(uri=uri, mime_type="image/png",
                                                   blob=base64.b64encode(PNG_IMAGE).decode())]
        elif uri == "doc://big.txt":
            contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text="x" * BIG_TEXT_BYTES)]
        elif uri.startswith(("doc://notes/", "doc://filler/", "doc://added/")):
            contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=f"Note {uri.rsplit('/', 1)[1]}.")]
        else:
            raise MCPError(code=-32002, message=f"Resource not found: {uri}")
        return types.ReadResourceResult(contents=contents)

    return {"on_list_resources": on_list_resources, "on_list_resource_templates": on_list_templates,
            "on_read_resource": on_read_resource}


async def _resource_tool(ctx: Any, state: ServerState, name: str, args: dict[str, Any]) -> types.CallToolResult:
    """The tools ``change_resources`` and ``resource_result`` (see the module docstring)."""
    if name == "change_resources":
        if args.get("action") == "add":
            state.extra_resources.append(types.Resource(uri=f"doc://added/{args['name']}", name=str(args["name"])))
            await ctx.session.send_resource_list_changed()  # handshake era (dropped on modern connections)
            await state.bus.publish(ResourcesListChanged())  # 2026-07-28 era: subscriptions/listen streams
        else:
            uri = f"doc://notes/{args['name']}"
            await ctx.session.send_resource_updated(uri)
            await state.bus.publish(ResourceUpdated(uri=uri))
        return types.CallToolResult(content=[types.TextContent(text="changed")])
    return types.CallToolResult(content=[
        types.TextContent(text="Here is the report."),
        types.EmbeddedResource(resource=types.TextResourceContents(uri="doc://notes/summary", mime_type="text/plain",
                                                                   text="Summary: all green.")),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="doc://images/chart.png", mime_type="image/png",
                                                                   blob=base64.b64encode(PNG_IMAGE).decode())),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="doc://files/report.pdf",
                                                                   mime_type="application/pdf",
                                                                   blob=base64.b64encode(PDF_BYTES).decode())),
        types.ResourceLink(uri="doc://notes/readme", name="readme", title="Project readme", mime_type="text/markdown"),
    ])


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

    def crash(self) -> None:
        """Kill the server abruptly: open connections are dropped, the port stops listening."""
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(timeout=10)


def _sse_app(server: Server[Any]) -> Any:
    """The legacy HTTP+SSE app (GET /sse stream, POST /messages/), handshake era only."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    sse = SseServerTransport("/messages/")

    async def handle_sse(request: Any) -> Response:
        async with sse.connect_sse(request.scope, request.receive, request._send) as streams:
            await server.run(
                streams[0], streams[1], server.create_initialization_options(NotificationOptions(tools_changed=True))
            )
        return Response()

    return Starlette(routes=[Route("/sse", endpoint=handle_sse, methods=["GET"]), Mount("/messages/", app=sse.handle_post_message)])


@contextmanager
def serve_mcp_http(port: int = 0, *, transport: str = "streamable_http") -> Iterator[RunningServer]:
    """Run the test server on 127.0.0.1:<free port> in a background thread.

    The listening socket is bound and listening before the thread starts, so clients can
    connect immediately (the kernel queues them until uvicorn accepts): no polling needed.

    Args:
        port: 0 for a free port; a given port to restart a crashed server where it was.
        transport: ``streamable_http`` (``/mcp``) or ``sse`` (legacy: ``/sse`` + ``/messages/``).

    Yields:
        RunningServer(url="http://127.0.0.1:<port>/mcp", state).
    """
    state = ServerState()
    server_app = build_server(state)
    app = _sse_app(server_app) if transport == "sse" else server_app.streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="mcp-test-server", daemon=True)
    thread.start()
    try:
        path = "/sse" if transport == "sse" else "/mcp"
        yield RunningServer(url=f"http://127.0.0.1:{port}{path}", state=state, _server=server, _thread=thread)
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


def _start_barrier(spec: str) -> None:
    """``<dir>:<n>``: announce this process, then wait until ``n`` processes have (see module doc)."""
    directory, _, count = spec.rpartition(":")
    open(os.path.join(directory, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 15
    while len(os.listdir(directory)) < int(count):
        if time.monotonic() > deadline:
            print("start barrier: the other servers never started", file=sys.stderr)
            sys.exit(2)
        time.sleep(0.02)


_DAEMON_SOURCE = (
    "import signal, sys, time\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def _become_stubborn(seconds: float) -> None:
    """``MCP_TEST_STUBBORN``: ignore the polite signals and leave a daemon behind (see module doc)."""
    import signal
    import subprocess

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    subprocess.Popen(
        [sys.executable, "-c", _DAEMON_SOURCE, repr(seconds), *sys.argv[1:]],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def main_stdio() -> None:
    """Serve the same tools over stdio (one connection, until stdin closes)."""
    stubborn = float(os.environ.get("MCP_TEST_STUBBORN") or 0)
    if stubborn:
        _become_stubborn(stubborn)
    if barrier := os.environ.get("MCP_TEST_START_BARRIER"):
        _start_barrier(barrier)
    if delay := os.environ.get("MCP_TEST_START_DELAY"):
        time.sleep(float(delay))
        os.environ["MCP_TEST_STARTED_AT"] = repr(time.time())
    server = build_server(ServerState())

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)
    if stubborn:
        time.sleep(stubborn)  # stdin closed: a well-behaved server would exit now


if __name__ == "__main__":
    main_stdio()
