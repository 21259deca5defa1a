"""An in-test MCP server with prompts and completions (the slash-command tests), on the mcp SDK
2.x low-level ``Server``, served by uvicorn in a daemon thread on 127.0.0.1 over Streamable HTTP
(``/mcp``) or the legacy HTTP+SSE transport (``/sse``).

Prompts (``prompts/list`` pages of 10; 14 prompts: two pages):

- ``review`` (title "Code review"; ``code`` required, ``language`` optional): one user message,
  ``Review this <language> code:`` and the code;
- ``picture`` (no arguments): a user message with a text, a PNG image and an embedded text
  resource, then an assistant message;
- ``filler_NN``: 12 prompts without arguments.

``completion/complete`` for ``review``'s ``language``: the languages starting with the typed
value (the request's context is recorded). Tool ``add_prompt(name)`` adds a prompt and announces
``notifications/prompts/list_changed`` (a plain notification on handshake-era connections, a
``subscriptions/listen`` event on 2026-07-28 ones).

``serve_prompts(prompts=False)`` serves a server without the prompts capability,
``completions=False`` one without completions.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.sse import SseServerTransport
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, PromptsListChanged
from mcp.shared.exceptions import MCPError

PAGE_SIZE = 10
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\x00" * 92
LANGUAGES = ["perl", "php", "python", "ruby", "rust"]


def _prompt(name: str, description: str, arguments: list[types.PromptArgument] | None = None,
            title: str | None = None) -> types.Prompt:
    return types.Prompt(name=name, title=title, description=description, arguments=arguments)


PROMPTS: list[types.Prompt] = [
    _prompt("review", "Review a piece of code.", [
        types.PromptArgument(name="code", description="The code to review.", required=True),
        types.PromptArgument(name="language", description="Its programming language.", required=False),
    ], title="Code review"),
    _prompt("picture", "Describe the attached picture."),
    *[_prompt(f"filler_{i:02d}", f"Filler prompt {i}.") for i in range(12)],
]


@dataclass
class PromptsState:
    """What the server saw."""

    list_cursors: list[str | None] = field(default_factory=list)
    gets: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    completions: list[tuple[str, str, dict[str, str] | None]] = field(default_factory=list)
    extra: list[types.Prompt] = field(default_factory=list)
    bus: InMemorySubscriptionBus = field(default_factory=InMemorySubscriptionBus)


def _get(state: PromptsState, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    args = params.arguments or {}
    state.gets.append((params.name, dict(args)))
    if params.name == "review":
        if "code" not in args:
            raise MCPError(code=types.INVALID_PARAMS, message="Missing required argument: code")
        language = args.get("language") or "this"
        text = f"Review this {language} code:\n\n{args['code']}"
        return types.GetPromptResult(description="A code review",
                                     messages=[types.PromptMessage(role="user", content=types.TextContent(text=text))])
    if params.name == "picture":
        image = types.ImageContent(data=base64.b64encode(PNG_BYTES).decode(), mime_type="image/png")
        notes = types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///notes.txt", mime_type="text/plain",
                                                                           text="hello notes"))
        return types.GetPromptResult(messages=[
            types.PromptMessage(role="user", content=types.TextContent(text="What is in this picture?")),
            types.PromptMessage(role="user", content=image),
            types.PromptMessage(role="user", content=notes),
            types.PromptMessage(role="assistant", content=types.TextContent(text="I will look closely.")),
        ])
    if any(p.name == params.name for p in PROMPTS + state.extra):
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=types.TextContent(
            text=f"{params.name} text"))])
    raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {params.name}")


def build_server(state: PromptsState, *, prompts: bool = True, completions: bool = True) -> Server[Any]:
    """The low-level server (see the module docstring)."""

    async def on_list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                              ) -> types.ListPromptsResult:
        cursor = params.cursor if params is not None else None
        state.list_cursors.append(cursor)
        start = int(cursor) if cursor else 0
        listed = PROMPTS + state.extra
        nxt = start + PAGE_SIZE
        return types.ListPromptsResult(prompts=listed[start:nxt], next_cursor=str(nxt) if nxt < len(listed) else None)

    async def on_get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        return _get(state, params)

    async def on_completion(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> types.CompleteResult:
        context = params.context.arguments if params.context is not None else None
        state.completions.append((params.argument.name, params.argument.value, context))
        values = []
        if isinstance(params.ref, types.PromptReference) and params.ref.name == "review" and params.argument.name == "language":
            values = [v for v in LANGUAGES if v.startswith(params.argument.value)]
        return types.CompleteResult(completion=types.Completion(values=values, has_more=False))

    async def on_list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                            ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="add_prompt", description="Add a prompt.", input_schema={
            "type": "object", "properties": {"name": {"type": "string"}}})])

    async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        name = str((params.arguments or {}).get("name", "late"))
        state.extra.append(_prompt(name, "Added at runtime."))
        await ctx.session.send_prompt_list_changed()  # handshake era
        await state.bus.publish(PromptsListChanged())  # 2026-07-28: subscriptions/listen streams
        return types.CallToolResult(content=[types.TextContent(text="added")])

    handlers: dict[str, Any] = {"on_list_tools": on_list_tools, "on_call_tool": on_call_tool,
                                "on_subscriptions_listen": ListenHandler(state.bus)}
    if prompts:
        handlers.update(on_list_prompts=on_list_prompts, on_get_prompt=on_get_prompt)
    if completions:
        handlers["on_completion"] = on_completion
    return Server("prompts-test-server", version="1.0", **handlers)


def _sse_app(server: Server[Any]) -> Any:
    """The legacy HTTP+SSE app (handshake era), announcing prompt list changes."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    sse = SseServerTransport("/messages/")

    async def handle_sse(request: Any) -> Response:
        async with sse.connect_sse(request.scope, request.receive, request._send) as streams:
            await server.run(streams[0], streams[1],
                             server.create_initialization_options(NotificationOptions(prompts_changed=True)))
        return Response()

    return Starlette(routes=[Route("/sse", endpoint=handle_sse, methods=["GET"]),
                             Mount("/messages/", app=sse.handle_post_message)])


@dataclass
class RunningPromptsServer:
    url: str
    state: PromptsState


@contextmanager
def serve_prompts(*, transport: str = "streamable_http", prompts: bool = True,
                  completions: bool = True) -> Iterator[RunningPromptsServer]:
    """Run the server on 127.0.0.1:<free port> in a daemon thread (listening before it starts)."""
    state = PromptsState()
    server = build_server(state, prompts=prompts, completions=completions)
    app = _sse_app(server) if transport == "sse" else server.streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, name="mcp-prompts-server", daemon=True)
    thread.start()
    try:
        path = "/sse" if transport == "sse" else "/mcp"
        yield RunningPromptsServer(url=f"http://127.0.0.1:{port}{path}", state=state)
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        sock.close()
