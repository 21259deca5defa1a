"""An MCP server for progress, logging, cancellation and sampling (issue 37): the SDK's low-level
``Server`` over Streamable HTTP on 127.0.0.1 (uvicorn in a daemon thread), in both protocol eras.

Tools:

- ``chatty()``: logs ``debug``, ``info``, ``warning`` and ``error`` messages (logger ``chatty``;
  the error's data an object), returns ``ok``.
- ``block()``: never returns (until cancelled).
- ``steps(n, delay)``: ``n`` progress notifications (``step i of n``), ``delay`` seconds apart
  (default 0), returns ``done``.
- ``summarize(text)``: asks the client's model (sampling) to summarize ``text`` and returns
  ``summary: <its text>``; a refusal is returned as ``refused: <message>`` on 2025-11-25 (the
  call goes on); on 2026-07-28 the request rides an ``InputRequiredResult``.
- ``pick()``: samples with one tool (``lookup``) offered and ``toolChoice: required``; returns
  ``used: <tool names of the tool_use blocks>``.

:class:`ProgState` records what the server saw: the ``logging/setLevel`` levels, every
``notifications/cancelled`` POSTed to it (their ``requestId``), the sampling requests (params).
"""

from __future__ import annotations

import json
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
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


@dataclass
class ProgState:
    """What the server saw."""

    levels: list[str] = field(default_factory=list)
    """``logging/setLevel`` requests, in order."""
    cancelled: list[Any] = field(default_factory=list)
    """The ``requestId`` of every ``notifications/cancelled`` the client POSTed."""
    samples: list[types.CreateMessageRequestParams] = field(default_factory=list)
    blocked: int = 0
    """``block`` calls started."""


def _tool(name: str, properties: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name=name, description=f"The {name} tool.", input_schema={"type": "object",
                                                                                "properties": properties or {}})


TOOLS = [_tool("chatty"), _tool("block"), _tool("steps", {"n": {"type": "integer"}, "delay": {"type": "number"}}),
         _tool("summarize", {"text": {"type": "string"}}), _tool("pick")]

LOOKUP = types.Tool(name="lookup", description="Look a word up.",
                    input_schema={"type": "object", "properties": {"word": {"type": "string"}}})


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)])


def _sample_params(name: str, args: dict[str, Any]) -> types.CreateMessageRequestParams:
    if name == "pick":
        return types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(text="Look up 'mcp'."))],
            max_tokens=200, tools=[LOOKUP], tool_choice=types.ToolChoice(mode="required"))
    return types.CreateMessageRequestParams(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(text=f"Summarize: {args.get('text', '')}"))],
        system_prompt="You write one-line summaries.", max_tokens=5_000)


def _answer_text(name: str, result: Any) -> str:
    blocks = result.content if isinstance(result.content, list) else [result.content]
    if name == "pick":
        return "used: " + ",".join(b.name for b in blocks if isinstance(b, types.ToolUseContent))
    return "summary: " + "".join(b.text for b in blocks if isinstance(b, types.TextContent))


async def _sample(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, state: ProgState) -> Any:
    """Sampling in either era: a request inside the call (2025-11-25), or an
    ``InputRequiredResult`` answered by the call's retry (2026-07-28)."""
    name, args = params.name, params.arguments or {}
    request = _sample_params(name, args)
    if ctx.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        state.samples.append(request)
        try:
            result = await ctx.session.create_message(  # type: ignore[call-overload]
                request.messages, max_tokens=request.max_tokens, system_prompt=request.system_prompt,
                tools=request.tools, tool_choice=request.tool_choice, related_request_id=ctx.request_id)
        except MCPError as exc:
            return _text(f"refused: {exc.error.message}")
        return _text(_answer_text(name, result))
    answered = (params.input_responses or {}).get("sample")
    if answered is None:
        state.samples.append(request)
        return types.InputRequiredResult(input_requests={"sample": types.CreateMessageRequest(params=request)},
                                         request_state="sampling")
    model = types.CreateMessageResultWithTools if name == "pick" else types.CreateMessageResult
    return _text(_answer_text(name, model.model_validate(answered if isinstance(answered, dict)
                                                           else answered.model_dump(by_alias=True))))


def build_server(state: ProgState) -> Server[Any]:
    """The low-level server (with ``logging/setLevel``, so handshake-era clients ask for a level)."""

    async def on_list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def on_set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        state.levels.append(params.level)
        return types.EmptyResult()

    async def on_call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        args = params.arguments or {}
        if params.name == "chatty":
            for level, data in (("debug", "d"), ("info", "i"), ("warning", "w"), ("error", {"code": 7, "why": "x"})):
                await ctx.session.send_log_message(level, data, logger="chatty", related_request_id=ctx.request_id)
            return _text("ok")
        if params.name == "block":
            state.blocked += 1
            await anyio.sleep_forever()
        if params.name == "steps":
            n = int(args.get("n", 3))
            for i in range(1, n + 1):
                await ctx.session.report_progress(i, n, f"step {i} of {n}")
                await anyio.sleep(float(args.get("delay", 0)))
            return _text("done")
        if params.name in ("summarize", "pick"):
            return await _sample(ctx, params, state)
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")

    return Server("prog-test-server", version="1.0", on_list_tools=on_list_tools, on_call_tool=on_call_tool,
                  on_set_logging_level=on_set_level)


def _recording(app: Any, state: ProgState) -> Any:
    """ASGI wrapper: notes the ``requestId`` of every ``notifications/cancelled`` POSTed, then
    hands the request on unchanged."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            parsed = json.loads(body or b"null")
        except ValueError:
            parsed = None
        for item in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(item, dict) and item.get("method") == "notifications/cancelled":
                state.cancelled.append((item.get("params") or {}).get("requestId"))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


@contextmanager
def serve_prog() -> Iterator[tuple[str, ProgState]]:
    """Serve :func:`build_server` on a free port; yields its ``/mcp`` URL and its state."""
    state = ProgState()
    app = _recording(build_server(state).streamable_http_app(), state)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="mcp-prog-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", state
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
