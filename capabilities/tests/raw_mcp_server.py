"""A hand-written Streamable HTTP MCP server for misbehaviour the SDK's own server cannot show.

Plain JSON-RPC over ``POST /mcp`` with JSON answers (handshake era, ``2025-06-18``), served by
uvicorn in a background thread on 127.0.0.1. What it can be told to do (:class:`RawState`):

- ``tools``: the raw ``tools/list`` entries, sent as they are (malformed ones included);
- ``results``: per tool name, the raw ``tools/call`` result, or ``{"jsonrpc_error": {...}}``
  to answer with that JSON-RPC error;
- ``status``: answer every request with this HTTP status (e.g. 401 with ``WWW-Authenticate``);
- :meth:`RawState.restart`: forget every session id, as a restarted server does; a request
  carrying an unknown id then gets **400** with the TypeScript SDK's body
  (``{"jsonrpc": "2.0", "error": {"code": -32000, "message": "Bad Request: No valid session
  ID provided"}, "id": null}``), which is what real servers answered in the probe.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn

PROTOCOL_VERSION = "2025-06-18"


@dataclass
class RawState:
    tools: list[Any] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    status: int | None = None
    """Answer every request with this HTTP status (None: serve normally)."""
    sessions: set[str] = field(default_factory=set)
    initializes: int = 0
    """Successful ``initialize`` requests (handshakes)."""
    stale_rejections: int = 0
    """Requests refused with 400 because their session id was unknown."""
    calls: list[str] = field(default_factory=list)

    def restart(self) -> None:
        """Forget every session (as after a server restart)."""
        self.sessions.clear()


def _app(state: RawState) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}

        async def answer(status: int, payload: Any = None, extra: dict[str, str] | None = None) -> None:
            raw = b"" if payload is None else json.dumps(payload).encode()
            out = [(b"content-type", b"application/json")] if payload is not None else []
            out += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
            await send({"type": "http.response.start", "status": status, "headers": out})
            await send({"type": "http.response.body", "body": raw})

        if scope["method"] == "GET":  # no server-initiated stream
            await answer(405)
            return
        if scope["method"] == "DELETE":
            await answer(200 if headers.get("mcp-session-id") in state.sessions else 404)
            return
        if state.status is not None:
            await answer(state.status, {"error": "nope"},
                         {"www-authenticate": 'Bearer realm="mcp"'} if state.status == 401 else None)
            return
        message = json.loads(body)
        method, msg_id = message.get("method"), message.get("id")
        session = headers.get("mcp-session-id")
        if method != "initialize" and session not in state.sessions:
            state.stale_rejections += 1
            await answer(400, {"jsonrpc": "2.0", "id": None,
                               "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}})
            return
        if msg_id is None:  # a notification
            await answer(202)
            return
        if method == "initialize":
            new = uuid.uuid4().hex
            state.sessions.add(new)
            state.initializes += 1
            await answer(200, {"jsonrpc": "2.0", "id": msg_id, "result": {
                "protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw-test-server", "version": "1.0"}}}, {"mcp-session-id": new})
            return
        if method == "tools/list":
            await answer(200, {"jsonrpc": "2.0", "id": msg_id, "result": {"tools": state.tools}})
            return
        if method == "tools/call":
            name = (message.get("params") or {}).get("name")
            state.calls.append(name)
            result = state.results.get(name, {"content": [{"type": "text", "text": f"{name} ok"}]})
            if isinstance(result, dict) and "jsonrpc_error" in result:
                await answer(200, {"jsonrpc": "2.0", "id": msg_id, "error": result["jsonrpc_error"]})
            else:
                await answer(200, {"jsonrpc": "2.0", "id": msg_id, "result": result})
            return
        await answer(200, {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": "Method not found"}})

    return app


@dataclass
class RawServer:
    url: str
    state: RawState


def tool(name: str, **schema: Any) -> dict[str, Any]:
    """A well-formed raw tool entry."""
    return {"name": name, "description": f"The {name} tool.",
            "inputSchema": {"type": "object", "properties": schema or {}}}


@contextmanager
def serve_raw_mcp(state: RawState | None = None) -> Iterator[RawServer]:
    """Run the raw server on 127.0.0.1:<free port> (``/mcp``) in a background thread."""
    state = state or RawState()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(state), log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="raw-mcp-server", daemon=True)
    thread.start()
    try:
        yield RawServer(url=f"http://127.0.0.1:{port}/mcp", state=state)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
