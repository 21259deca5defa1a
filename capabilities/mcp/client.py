"""MCP capability client: one connection to one MCP server, over stdio or Streamable HTTP.

Built on the ``mcp`` SDK 2.x :class:`mcp.Client`. Usage::

    async with McpConnection(config) as conn:           # connect + handshake, bounded
        infos = await conn.list_tools()                 # every page, bounded
        result = await conn.call_tool("get_current_time", {"timezone": "UTC"}, timeout_seconds=30)

Ownership (house style: "each MCP session has one owner task"): ``__aenter__`` starts a
dedicated *owner task* that opens the SDK client, waits until it is told to stop, and closes
it, so the session is always opened and closed in the same task and event loop. The
connection object itself must also be entered and exited in one task (checked). Tool calls
may come from any task of that loop, concurrently: the SDK correlates requests by id. Keeping
the SDK's task groups inside the owner task also means a transport failure (server died, HTTP
error) ends only that task; in-flight and later calls then fail with ``ToolError`` instead of
the failure cancelling the caller's task.

No Django imports: the runner, the pool and tests use this directly.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import IO, Any, Literal

import anyio
import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import ValidationError

from capabilities.confinement import SandboxProfile, confined_argv, confined_env
from capabilities.mcp.transport_end import TransportEnd, watched
from capabilities.tools import ToolError, ToolResult

logger = logging.getLogger(__name__)

_ALIAS_RE = re.compile(r"^[a-z0-9_-]{1,64}$")

_MAX_LIST_PAGES = 1_000
"""Upper bound on ``tools/list`` pages, against a server whose cursors never end."""

_CLOSE_TIMEOUT_SECONDS = 10.0
"""How long ``__aexit__`` waits for the owner task to close the session before cancelling it.
The SDK's stdio shutdown is itself bounded (about 6.5 s worst case: stdin close, SIGTERM,
SIGKILL), and it is shielded, so the cancel cannot leak the server process."""

_HTTP_READ_TIMEOUT_SECONDS = 300.0
"""httpx read timeout (the SDK's default): a response stream that stays silent longer fails.
A tool call longer than this on a server that answers with plain JSON (no SSE keep-alive)
would fail the whole connection, so call timeouts should stay below it."""

_STDERR_TAIL_LINES = 20
"""Lines of a stdio server's stderr kept for connect-error messages."""

_CLIENT_INFO = mcp_types.Implementation(name="agent-platform", version="0.1.0")


class McpConnectError(ToolError):
    """Connecting to an MCP server (spawn, transport, handshake) failed or timed out.

    Raised by ``McpConnection.__aenter__``. The message names the server alias and, for stdio
    servers, ends with the last lines the server wrote to stderr.
    """

    def __init__(self, message: str, *, alias: str) -> None:
        super().__init__(message, code="mcp_connect_error")
        self.alias = alias
        """The ``McpServerConfig.alias`` of the server that could not be reached."""


class McpConnectionLost(ToolError):
    """The session's transport failed (server process exited, connection dropped, session closed).

    ``code`` is ``mcp_error``. The pool treats it as "this session is dead": it closes the
    session and reconnects on next use.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, code="mcp_error")


ProgressCallback = Callable[[float, "float | None", "str | None"], Awaitable[None]]
"""``await progress(progress, total, message)``: a server progress notification for one call."""


def check_timeout_seconds(value: float, *, what: str) -> None:
    """Validate a timeout (house rule: positive finite seconds).

    Args:
        value: The timeout, in seconds.
        what: Its name, for the message.

    Raises:
        ValueError: ``value`` is not a positive finite int/float (bools rejected).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive finite number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """How to reach one MCP server. Validated on construction (``ValueError``)."""

    alias: str
    """Short name used in exposed tool names and messages: ``[a-z0-9_-]``, 1-64 chars."""
    transport: Literal["stdio", "sse", "streamable_http"]
    """``stdio`` (spawn a local process), ``sse`` (legacy HTTP+SSE, protocol 2024-11-05) or
    ``streamable_http``. Both protocol eras (the ``initialize`` handshake and 2026-07-28
    ``server/discover``) are negotiated automatically (the SDK's ``mode="auto"``)."""
    command: str = ""
    """stdio: the executable to spawn (absolute path or looked up on the child's PATH)."""
    args: tuple[str, ...] = ()
    """stdio: its arguments."""
    url: str = ""
    """sse / streamable_http: the MCP endpoint (the SSE stream URL for ``sse``), ``http://`` or
    ``https://``."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """sse / streamable_http: sent with every request (e.g. ``Authorization``). Not shown in ``repr``."""
    connect_timeout_seconds: float = 30.0
    """Bound on spawn/TCP connect plus the MCP handshake; also the HTTP connect timeout."""
    list_timeout_seconds: float = 30.0
    """Bound on one whole ``list_tools`` (all pages together)."""
    call_timeout_seconds: float = 60.0
    """Bound on one tool call (the run's per-tool timeout may be shorter and then wins)."""
    protocol_mode: Literal["auto", "legacy"] = "auto"
    """``auto``: probe ``server/discover`` (2026-07-28) and fall back to the ``initialize``
    handshake; ``legacy``: the handshake only (for servers that mishandle the probe)."""
    sandbox: SandboxProfile | None = None
    """stdio (required): the confinement the process is started in
    (:mod:`capabilities.confinement`); its ``env`` is the server's whole environment on top of
    PATH/HOME/LANG (the template's variables and the tenant's secrets). There is no way to
    start a stdio server unconfined. None for sse / streamable_http."""

    def __post_init__(self) -> None:
        if not _ALIAS_RE.match(self.alias):
            raise ValueError(f"alias must match [a-z0-9_-]{{1,64}}, got {self.alias!r}")
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"MCP server {self.alias!r}: a stdio server needs a command")
            if self.sandbox is None:
                raise ValueError(f"MCP server {self.alias!r}: a stdio server runs confined: it needs a sandbox profile")
        elif self.transport in ("sse", "streamable_http"):
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(
                    f"MCP server {self.alias!r}: url must start with http:// or https://, got {self.url!r}"
                )
        else:
            raise ValueError(f"MCP server {self.alias!r}: unknown transport {self.transport!r}")
        if self.protocol_mode not in ("auto", "legacy"):
            raise ValueError(f"MCP server {self.alias!r}: protocol_mode must be 'auto' or 'legacy'")
        check_timeout_seconds(self.connect_timeout_seconds, what="connect_timeout_seconds")
        check_timeout_seconds(self.list_timeout_seconds, what="list_timeout_seconds")
        check_timeout_seconds(self.call_timeout_seconds, what="call_timeout_seconds")
        # Read-only copies, so a caller mutating its dict cannot change a live config.
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    def _identity(self) -> tuple[Any, ...]:
        return (
            self.alias,
            self.transport,
            self.command,
            self.args,
            self.url,
            tuple(sorted(self.headers.items())),
            self.connect_timeout_seconds,
            self.list_timeout_seconds,
            self.call_timeout_seconds,
            self.protocol_mode,
            None if self.sandbox is None else (
                self.sandbox.network, self.sandbox.ro_binds, tuple(sorted(self.sandbox.env.items())),
                self.sandbox.uid, self.sandbox.gid, self.sandbox.bwrap_path, self.sandbox.bridge_python,
                self.sandbox.egress_socket, dataclasses.astuple(self.sandbox.limits),
            ),
        )

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def fingerprint(self) -> str:
        """SHA-256 hex of every field (secrets included, but only as a hash).

        The pool keys sessions on it, so an edited server (new command, URL, env, headers,
        timeouts or sandbox limits) gets a new session instead of reusing the old one.
        """
        return hashlib.sha256(json.dumps(self._identity(), default=list).encode()).hexdigest()

    @property
    def endpoint(self) -> str:
        """Where the server is, for messages that may reach the model or logs.

        The URL without credentials, query or fragment (they may carry tokens), or the stdio
        command without its arguments (same reason). Never the environment or headers.
        """
        if self.transport != "stdio":
            parts = urllib.parse.urlsplit(self.url)
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            port = f":{parts.port}" if parts.port is not None else ""
            return f"{parts.scheme}://{host}{port}{parts.path}"
        return self.command


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool as an MCP server lists it."""

    name: str
    """The server's own tool name (pass it to ``call_tool``; not the exposed name)."""
    description: str
    """The server's description ('' when it gave none)."""
    input_schema: dict[str, Any]
    """JSON Schema of the arguments, as the server sent it (see ``tool.normalize_input_schema``)."""


class _StderrTail:
    """Drains a stdio server's stderr in a daemon thread, keeping the last lines.

    A pipe nobody reads would block a chatty server once the pipe buffer fills; the SDK's
    default (our own stderr) mixes server noise into worker logs. Lines are logged at DEBUG
    under this module's logger and the last ``_STDERR_TAIL_LINES`` are kept for error messages.
    """

    def __init__(self, alias: str) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: IO[str] = os.fdopen(write_fd, "w")
        self._lines: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._alias = alias
        self._thread = threading.Thread(
            target=self._drain, args=(os.fdopen(read_fd, "rb"),), name=f"mcp-stderr:{alias}", daemon=True
        )
        self._thread.start()

    def _drain(self, reader: IO[bytes]) -> None:
        with reader:
            for raw in reader:
                line = raw.decode("utf-8", errors="replace").rstrip()
                if line:
                    self._lines.append(line)
                    logger.debug("MCP server %r stderr: %s", self._alias, line)

    def close_writer(self) -> None:
        """Close our copy of the pipe's write end (the child keeps its own)."""
        self.writer.close()

    async def tail(self, *, wait_seconds: float = 1.0) -> str:
        """The last stderr lines, joined; waits up to ``wait_seconds`` for the pipe to reach EOF."""
        self.close_writer()
        await asyncio.to_thread(self._thread.join, wait_seconds)
        return "\n".join(self._lines)


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (itself when it is not a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaf_exceptions(inner)]
    return [exc]


def _describe(exc: BaseException) -> str:
    """One line naming the first real cause inside ``exc`` (unwrapping exception groups)."""
    leaves = [e for e in _leaf_exceptions(exc) if not isinstance(e, asyncio.CancelledError)] or [exc]
    leaf = leaves[0]
    text = str(leaf) or repr(leaf)
    return f"{type(leaf).__name__}: {text}"


def connect_failure_text(failure: BaseException, http_log: HttpStatusLog | None) -> str:
    """One line for a failed connect: :func:`_describe` of the failure, with the HTTP status
    of the server's last error answer when it sent one (the SDK's handshake error loses it:
    a 401 with ``WWW-Authenticate`` would otherwise read like a server error)."""
    text = _describe(failure)
    status = http_log.describe() if http_log is not None else ""
    if status:
        text = f"{status} ({text})"
    return text


def _base64_size(data: str) -> int:
    """Decoded size in bytes of base64 ``data`` (estimated from its length if it is invalid)."""
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def _render_block(block: Any) -> tuple[str, bool]:
    """Render one content block as text for the model.

    Returns:
        ``(text, is_text_block)``: text blocks verbatim; images, audio, resource links and
        blob resources as one-line summaries like ``[image image/png, 1234 bytes]``; embedded
        text resources as a summary line followed by their text.
    """
    if isinstance(block, mcp_types.TextContent):
        return block.text, True
    if isinstance(block, mcp_types.ImageContent):
        return f"[image {block.mime_type}, {_base64_size(block.data)} bytes]", False
    if isinstance(block, mcp_types.AudioContent):
        return f"[audio {block.mime_type}, {_base64_size(block.data)} bytes]", False
    if isinstance(block, mcp_types.ResourceLink):
        mime = f" {block.mime_type}" if block.mime_type else ""
        return f"[resource link {block.uri}{mime}]", False
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        mime = f" {resource.mime_type}" if resource.mime_type else ""
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri}{mime}]\n{resource.text}", False
        return f"[resource {resource.uri}{mime}, {_base64_size(resource.blob)} bytes]", False
    return f"[{getattr(block, 'type', type(block).__name__)} content]", False


def _to_tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Map a successful ``CallToolResult`` to a ``ToolResult`` (see ``McpConnection.call_tool``)."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        text, is_text = _render_block(block)
        has_text = has_text or is_text
        parts.append(text)
    return _tool_result(parts, has_text=has_text, data=result.structured_content)


def _tool_result(parts: list[str], *, has_text: bool, data: Any) -> ToolResult:
    """The ``ToolResult`` of rendered content blocks: structured content goes first, as JSON,
    when no block was text (so the model still reads it)."""
    if data is not None and not has_text:
        parts = [json.dumps(data, ensure_ascii=False, default=str), *parts]
    return ToolResult(content="\n".join(parts), data=data)


def _error_text(result: mcp_types.CallToolResult, name: str) -> str:
    """The text of an ``isError`` result, for the model."""
    text = "\n".join(_render_block(block)[0] for block in result.content).strip()
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return text or f"MCP tool {name!r} reported an error without a message"


_SESSION_ID_HEADER = "mcp-session-id"
_STALE_SESSION_STATUSES = frozenset({400, 404})
"""HTTP statuses with which a Streamable HTTP server refuses a session id it does not know
(404 per the spec; 400 "No valid session ID provided" from the TypeScript SDK's servers)."""


class HttpStatusLog:
    """The HTTP error answers one connection's HTTP client received (an httpx2 response hook).

    The SDK turns an HTTP error into a JSON-RPC error without its status ("Server returned
    an error response"); this keeps the status so messages can say what happened (``HTTP
    401: authentication required``), and counts the answers that refused our session id
    (400/404 to a request that carried ``Mcp-Session-Id``), so the pool can tell a server
    that restarted and forgot the session from an ordinary error.
    """

    def __init__(self) -> None:
        self.last_status: int | None = None
        """The last HTTP error status (>= 400), or None."""
        self.last_www_authenticate: str = ""
        """Its ``WWW-Authenticate`` header ('' when absent)."""
        self.session_rejections = 0
        """400/404 answers so far to requests that carried a session id."""
        self.errors = 0
        """HTTP error answers so far."""
        self.skipped_tools: list[str] = []
        """``"tool 'x' skipped: why"`` for each malformed tool taken out of a ``tools/list``
        answer (:class:`ToolListFilter`), in order."""

    async def on_response(self, response: httpx2.Response) -> None:
        """httpx2 ``event_hooks["response"]`` hook: record an error status."""
        if response.status_code < 400:
            return
        self.errors += 1
        self.last_status = response.status_code
        self.last_www_authenticate = response.headers.get("www-authenticate", "")
        if response.status_code in _STALE_SESSION_STATUSES and _SESSION_ID_HEADER in response.request.headers:
            self.session_rejections += 1

    def describe(self, *, since: int = 0) -> str:
        """``HTTP <status>`` of the last error (``: authentication required`` for 401,
        ``: forbidden`` for 403), or '' when none was seen after the first ``since`` errors."""
        if self.last_status is None or self.errors <= since:
            return ""
        what = {401: ": authentication required", 403: ": forbidden"}.get(self.last_status, "")
        return f"HTTP {self.last_status}{what}"


def http_error_message(message: str, http_log: HttpStatusLog | None, *, since: int = 0) -> str:
    """``message`` (an SDK error's) with the HTTP status the SDK dropped, when one was seen
    (after the log's first ``since`` errors): the SDK's stand-in "Server returned an error
    response" is replaced by it, other messages get it appended."""
    status = http_log.describe(since=since) if http_log is not None else ""
    if not status:
        return message
    if message in ("Server returned an error response", "Not Found", ""):
        return status
    return f"{message} ({status})"


_MAX_FILTERED_JSON_BYTES = 8_000_000
"""A JSON answer longer than this is passed on unfiltered (the SDK then judges it whole)."""


def _filter_tool_list(message: Any, log: HttpStatusLog) -> Any | None:
    """The JSON-RPC message (or batch) with malformed ``result.tools`` entries removed, or None
    when nothing had to change."""
    if isinstance(message, list):
        out = [_filter_tool_list(item, log) for item in message]
        return None if all(o is None for o in out) else [o if o is not None else m for o, m in zip(out, message, strict=False)]
    if not isinstance(message, dict):
        return None
    result = message.get("result")
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return None
    kept = []
    for index, raw in enumerate(tools):
        try:
            mcp_types.Tool.model_validate(raw, by_name=False)
        except ValidationError as exc:
            name = raw.get("name") if isinstance(raw, dict) else None
            label = repr(name[:80]) if isinstance(name, str) else f"#{index + 1}"
            problem = exc.errors()[0]["msg"] if exc.errors() else "invalid"
            where = ".".join(str(p) for p in exc.errors()[0]["loc"]) if exc.errors() else ""
            log.skipped_tools.append(f"tool {label} skipped: {where + ': ' if where else ''}{problem}")
            logger.warning("MCP server answer: skipping malformed tool %s: %s", label, problem)
            continue
        kept.append(raw)
    if len(kept) == len(tools):
        return None
    return {**message, "result": {**result, "tools": kept}}


class _SseToolListFilter(httpx2.AsyncByteStream):
    """An SSE byte stream whose ``tools/list`` results lose their malformed tools (each event
    is passed on when complete; other events unchanged)."""

    def __init__(self, inner: Any, log: HttpStatusLog) -> None:
        self._inner = inner
        self._log = log

    async def __aiter__(self) -> Any:
        buffer = b""
        async for chunk in self._inner:
            buffer += chunk
            while True:
                ends = [i for i in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if i >= 0]
                if not ends:
                    break
                end = min(ends)
                size = 4 if buffer[end:end + 4] == b"\r\n\r\n" else 2
                block, buffer = buffer[: end + size], buffer[end + size:]
                yield self._event(block)
        if buffer:
            yield buffer

    def _event(self, block: bytes) -> bytes:
        if b'"tools"' not in block:
            return block
        lines = block.decode("utf-8", errors="replace").splitlines()
        data = [line[5:].lstrip(" ") if line.startswith("data:") else None for line in lines]
        payload = "\n".join(d for d in data if d is not None)
        try:
            filtered = _filter_tool_list(json.loads(payload), self._log)
        except ValueError:
            return block
        if filtered is None:
            return block
        others = [line for line, d in zip(lines, data, strict=False) if d is None and line]
        return ("\n".join([*others, "data: " + json.dumps(filtered)]) + "\n\n").encode()

    async def aclose(self) -> None:
        await self._inner.aclose()


class ToolListFilter(httpx2.AsyncBaseTransport):
    """An httpx2 transport around another that takes malformed tools out of ``tools/list``
    answers (JSON and SSE), recording them in ``log.skipped_tools``: the SDK validates a
    whole page at once, so one malformed tool would otherwise fail the whole listing (and
    the server). Compressed answers are passed on as they are."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, log: HttpStatusLog) -> None:
        self._inner = inner
        self._log = log

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
            return response
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "text/event-stream":
            return httpx2.Response(response.status_code, headers=response.headers,
                                   stream=_SseToolListFilter(response.stream, self._log),
                                   extensions=response.extensions, request=request)
        if kind != "application/json":
            return response
        body = b""
        async for chunk in response.stream:
            body += chunk
            if len(body) > _MAX_FILTERED_JSON_BYTES:
                break
        else:
            await response.aclose()
            filtered = None
            if b'"tools"' in body:
                try:
                    filtered = _filter_tool_list(json.loads(body), self._log)
                except ValueError:
                    filtered = None
            if filtered is not None:
                body = json.dumps(filtered).encode()
            headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-length"]
            return httpx2.Response(response.status_code, headers=[*headers, ("content-length", str(len(body)))],
                                   content=body, extensions=response.extensions, request=request)
        # Too long to filter: pass on what was read and the rest.
        rest = response.stream

        async def replay() -> Any:
            yield body
            async for chunk in rest:
                yield chunk

        return httpx2.Response(response.status_code, headers=response.headers, stream=_Replay(replay(), rest),
                               extensions=response.extensions, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Replay(httpx2.AsyncByteStream):
    def __init__(self, chunks: Any, inner: Any) -> None:
        self._chunks = chunks
        self._inner = inner

    async def __aiter__(self) -> Any:
        async for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _checked_http_client(
    headers: Mapping[str, str] | None, timeout: httpx2.Timeout | None, auth: httpx2.Auth | None,
    http_log: HttpStatusLog | None,
) -> httpx2.AsyncClient:
    """The HTTP client of a remote MCP server: every connect checked against the outbound
    address rules (:func:`capabilities.netsafe.outbound_transport`), HTTP errors recorded in
    ``http_log``, no proxies from the environment, redirects not followed (the SDK follows
    same-origin ones itself)."""
    from capabilities.netsafe import outbound_transport

    return httpx2.AsyncClient(
        headers=dict(headers or {}), timeout=timeout, auth=auth, trust_env=False,
        transport=outbound_transport() if http_log is None else ToolListFilter(outbound_transport(), http_log),
        event_hooks={"response": [http_log.on_response]} if http_log is not None else None,
    )


def make_client(
    config: McpServerConfig,
    stack: AsyncExitStack,
    *,
    message_handler: Callable[[Any], Awaitable[None]] | None = None,
    http_log: HttpStatusLog | None = None,
    transport_end: TransportEnd | None = None,
) -> tuple[Client, _StderrTail | None]:
    """Build the (unentered) SDK client for ``config``; HTTP clients and pipes go on ``stack``.

    Enter the returned client on the same ``stack``, in the task that will also exit it.

    Args:
        config: The server.
        stack: Owns the HTTP client (sse / streamable_http) and the stderr pipe (stdio).
        message_handler: The SDK's ``message_handler``: receives server notifications (e.g.
            ``ToolListChangedNotification`` on handshake-era connections) and transport
            exceptions.
        http_log: sse / streamable_http: records the HTTP error statuses of this connection.
        transport_end: Marked when the connection's transport ends (a stdio server exits, a
            connection drops), also while no call is in flight
            (:mod:`capabilities.mcp.transport_end`).

    Remote servers (sse / streamable_http) are reached through the outbound address rules
    (``capabilities.netsafe``): a URL that resolves to loopback, a private or link-local
    network or a metadata address fails the connect, unless an operator allowed it.

    Returns:
        ``(client, stderr_tail)``; ``stderr_tail`` is None except for stdio servers.
    """
    stderr: _StderrTail | None = None
    if config.transport == "stdio":
        # Always confined (McpServerConfig requires a sandbox for stdio). Raises
        # SandboxUnavailable (bwrap/setpriv missing): reported like a failed spawn. Lifecycle:
        # the SDK starts the launcher in a new process group and, on close, closes its stdin,
        # then kills that group; bubblewrap's --die-with-parent takes the sandbox's PID 1 along
        # with the launcher (or with this worker, if it dies first), and with PID 1 the kernel
        # kills every process of the sandbox's PID namespace, daemons included.
        if config.sandbox is None:  # unreachable: McpServerConfig refuses it
            raise ValueError(f"MCP server {config.alias!r}: a stdio server runs confined: it needs a sandbox profile")
        full = confined_argv([config.command, *config.args], config.sandbox)
        params = StdioServerParameters(command=full[0], args=full[1:], env=confined_env(config.sandbox))
        stderr = _StderrTail(config.alias)
        stack.callback(stderr.close_writer)
        transport: Any = stdio_client(params, errlog=stderr.writer)  # type: ignore[arg-type]
    elif config.transport == "sse":
        transport = sse_client(
            config.url,
            headers=dict(config.headers),
            timeout=config.connect_timeout_seconds,
            sse_read_timeout=_HTTP_READ_TIMEOUT_SECONDS,
            httpx_client_factory=lambda headers=None, timeout=None, auth=None: _checked_http_client(
                headers, timeout, auth, http_log),
        )
    else:
        # What the SDK's own default client is, plus our headers and connect timeout.
        # Redirects stay off: the SDK follows same-origin ones itself.
        http_client = _checked_http_client(
            config.headers, httpx2.Timeout(config.connect_timeout_seconds, read=_HTTP_READ_TIMEOUT_SECONDS), None,
            http_log,
        )
        stack.push_async_callback(http_client.aclose)
        transport = streamable_http_client(config.url, http_client=http_client)
    if transport_end is not None:
        transport = watched(transport, transport_end)
    # cache=None: every list_tools reaches the server (we keep our own catalogue).
    client = Client(
        transport, cache=None, client_info=_CLIENT_INFO, message_handler=message_handler, mode=config.protocol_mode
    )
    return client, stderr


async def list_all_tools(
    client: Client, config: McpServerConfig, *, http_log: HttpStatusLog | None = None,
) -> list[McpToolInfo]:
    """List every tool of the server, following ``nextCursor`` across all pages.

    Bounded as a whole by ``config.list_timeout_seconds`` and by 1,000 pages. A name the
    server lists twice is kept once (the first listing). Over HTTP, malformed tools were
    already taken out of the server's answers (:class:`ToolListFilter`, reported in
    ``http_log.skipped_tools``), so one bad tool does not take the whole server away.

    Args:
        client: An entered SDK client.
        config: The server.
        http_log: The connection's HTTP status log (for messages that keep the status).

    Returns:
        The tools in server order.

    Raises:
        ToolError: ``timeout`` when the listing took too long; ``mcp_error`` for a protocol
            error, a repeated cursor or too many pages.
        McpConnectionLost: The transport failed or the session is closed.
    """
    alias, timeout = config.alias, config.list_timeout_seconds
    errors_before = http_log.errors if http_log is not None else 0
    tools: list[McpToolInfo] = []
    seen_names: set[str] = set()
    seen_cursors: set[str] = set()
    cursor: str | None = None
    try:
        with anyio.fail_after(timeout):
            for _ in range(_MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                page_tools, next_cursor = list(page.tools), page.next_cursor
                for tool in page_tools:
                    if tool.name in seen_names:
                        logger.warning("MCP server %r lists tool %r twice; keeping the first", alias, tool.name)
                        continue
                    seen_names.add(tool.name)
                    tools.append(
                        McpToolInfo(
                            name=tool.name,
                            description=tool.description or "",
                            input_schema=dict(tool.input_schema),
                        )
                    )
                cursor = next_cursor
                if not cursor:
                    return tools
                if cursor in seen_cursors:
                    raise ToolError(
                        f"MCP server {alias!r} repeated the tools/list cursor {cursor!r}", code="mcp_error"
                    )
                seen_cursors.add(cursor)
    except TimeoutError:
        raise ToolError(
            f"Listing the tools of MCP server {alias!r} timed out after {timeout:g} s", code="timeout"
        ) from None
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            raise McpConnectionLost(
                f"The connection to MCP server {alias!r} closed while listing its tools: {exc.message}"
            ) from exc
        raise ToolError(
            f"MCP server {alias!r} failed to list its tools: {http_error_message(exc.message, http_log, since=errors_before)}",
            code="mcp_error",
        ) from exc
    except (RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
        # RuntimeError: the SDK's "used outside its context" when the session just closed.
        raise McpConnectionLost(f"MCP server {alias!r} failed to list its tools: {_describe(exc)}") from exc
    except ValidationError as exc:
        raise ToolError(
            f"MCP server {alias!r} failed to list its tools: {_describe(exc)}", code="mcp_error"
        ) from exc
    raise ToolError(f"MCP server {alias!r} returned more than {_MAX_LIST_PAGES} pages of tools", code="mcp_error")


async def call_tool_raw(
    client: Client,
    config: McpServerConfig,
    name: str,
    arguments: dict[str, Any],
    *,
    timeout_seconds: float,
    progress: ProgressCallback | None = None,
    http_log: HttpStatusLog | None = None,
) -> mcp_types.CallToolResult:
    """Call one tool; return its successful result unmapped.

    Args:
        client: An entered SDK client (call from a task of its event loop).
        config: The server (alias for messages).
        name: The server's tool name.
        arguments: JSON-serialisable arguments object.
        timeout_seconds: Bound on the whole call, positive and finite. On expiry the SDK
            sends the server a cancellation notification.
        progress: Awaited for each progress notification the server sends for this call.
        http_log: The connection's HTTP status log: a JSON-RPC error the SDK made from an
            HTTP error keeps its status in the message (``HTTP 401: authentication required``).

    Returns:
        The ``CallToolResult`` (never one with ``isError``).

    Raises:
        ToolError: ``mcp_tool_error`` when the server returned ``isError`` (message: the
            tool's error text); ``timeout`` after ``timeout_seconds``; ``mcp_error`` for a
            protocol error (unknown tool, bad result).
        McpConnectionLost: The transport failed or the session closed during the call.
    """
    alias = config.alias
    errors_before = http_log.errors if http_log is not None else 0
    timeout_message = f"MCP tool {name!r} timed out after {timeout_seconds:g} s"
    try:
        # Two bounds: the SDK's own read timeout (sends the courtesy cancel) and an outer
        # one covering what the SDK does not time (writing the request, output validation).
        with anyio.fail_after(timeout_seconds):
            result = await client.call_tool(
                name, arguments, read_timeout_seconds=timeout_seconds, progress_callback=progress
            )
    except TimeoutError:
        raise ToolError(timeout_message, code="timeout") from None
    except MCPError as exc:
        if exc.code == REQUEST_TIMEOUT:
            raise ToolError(timeout_message, code="timeout") from None
        if exc.code == CONNECTION_CLOSED:
            raise McpConnectionLost(
                f"The connection to MCP server {alias!r} closed during tool {name!r}: {exc.message}"
            ) from exc
        raise ToolError(
            f"MCP server {alias!r} rejected tool {name!r}: {http_error_message(exc.message, http_log, since=errors_before)}",
            code="mcp_error",
        ) from exc
    except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
        raise McpConnectionLost(f"The connection to MCP server {alias!r} closed during tool {name!r}") from exc
    except (ValidationError, RuntimeError) as exc:
        # RuntimeError covers the SDK's output-schema check, unexpected input_required or
        # claimed results, and "used outside its context" when the session just closed.
        if isinstance(exc, RuntimeError) and "context" in str(exc):
            raise McpConnectionLost(
                f"The connection to MCP server {alias!r} is closed; tool {name!r} was not called"
            ) from exc
        raise ToolError(f"MCP server {alias!r}: tool {name!r} failed: {_describe(exc)}", code="mcp_error") from exc
    if result.is_error:
        raise ToolError(_error_text(result, name), code="mcp_tool_error")
    return result


class McpConnection:
    """One open MCP session, usable as ``async with McpConnection(config) as conn:``.

    Single use: enter it once. Enter and exit it in the same task (``RuntimeError``
    otherwise); call ``list_tools``/``call_tool`` from any task of the same event loop,
    concurrently if you like.
    """

    def __init__(self, config: McpServerConfig) -> None:
        """Prepare a connection; nothing is spawned or dialled until ``__aenter__``.

        Args:
            config: The server to connect to.
        """
        self.config = config
        self._client: Client | None = None
        self._worker: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._owner_task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stderr: _StderrTail | None = None
        self._list_attempted = False
        self._list_lock = asyncio.Lock()
        self.http_log = HttpStatusLog()
        """HTTP error statuses of this connection (remote servers)."""

    # --- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> McpConnection:
        """Spawn or dial the server and complete the MCP handshake.

        Returns:
            ``self``, connected.

        Raises:
            McpConnectError: Spawning, connecting or the handshake failed, or took longer than
                ``config.connect_timeout_seconds``. Nothing is left running.
            RuntimeError: The connection was already entered once.
        """
        if self._worker is not None:
            raise RuntimeError(f"McpConnection {self.config.alias!r} is single-use and was already entered")
        self._owner_task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = self._loop.create_future()
        worker = asyncio.create_task(self._own_session(ready), name=f"mcp-session:{self.config.alias}")
        self._worker = worker
        try:
            await asyncio.wait(
                {ready, worker}, timeout=self.config.connect_timeout_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:  # cancelled while connecting: leave nothing behind, then re-raise
            await self._stop_worker(cancel=True)
            raise
        if ready.done() and not worker.done():
            worker.add_done_callback(self._on_worker_done)
            return self

        ready.cancel()
        timed_out = not worker.done()
        await self._stop_worker(cancel=True)
        failure = None if worker.cancelled() else worker.exception()
        cfg = self.config
        if timed_out or failure is None:
            message = (
                f"Could not connect to MCP server {cfg.alias!r} ({cfg.transport} {cfg.endpoint}): "
                f"timed out after {cfg.connect_timeout_seconds:g} s"
            )
        else:
            message = (
                f"Could not connect to MCP server {cfg.alias!r} ({cfg.transport} {cfg.endpoint}): "
                f"{connect_failure_text(failure, self.http_log)}"
            )
        if self._stderr is not None:
            tail = await self._stderr.tail()
            if tail:
                message += f"\nServer stderr (last lines):\n{tail}"
        raise McpConnectError(message, alias=cfg.alias) from failure

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the session; a stdio server process is terminated (SIGTERM, then SIGKILL).

        Runs its shutdown shielded from anyio cancellation, so it also completes when the body
        raised or was cancelled. It waits up to ``_CLOSE_TIMEOUT_SECONDS`` before cancelling
        the owner task. Never raises the body's exception itself.

        Raises:
            RuntimeError: Exited in a different task than the one that entered it (the session
                is still closed first).
        """
        await self._stop_worker(cancel=False)
        if self._stderr is not None:
            self._stderr.close_writer()
        if asyncio.current_task() is not self._owner_task:
            raise RuntimeError(
                f"McpConnection {self.config.alias!r} was exited in a different task than it was entered in"
            )

    async def _own_session(self, ready: asyncio.Future[None]) -> None:
        """Owner task body: open the SDK client, publish it, wait for stop, close it."""
        async with AsyncExitStack() as stack:
            client, self._stderr = make_client(self.config, stack, http_log=self.http_log)
            client = await stack.enter_async_context(client)
            if self._stderr is not None:
                self._stderr.close_writer()  # the child holds its own copy now
            self._client = client
            if not ready.done():
                ready.set_result(None)
            try:
                await self._stop.wait()
            finally:
                self._client = None

    async def _stop_worker(self, *, cancel: bool) -> None:
        """Tell the owner task to close the session and wait for it (shielded, bounded)."""
        worker = self._worker
        if worker is None:
            return
        self._stop.set()
        if cancel:
            worker.cancel()
        with anyio.CancelScope(shield=True):
            done, _ = await asyncio.wait({worker}, timeout=_CLOSE_TIMEOUT_SECONDS)
            if not done:
                logger.warning(
                    "MCP server %r: session did not close within %g s; cancelling its owner task",
                    self.config.alias,
                    _CLOSE_TIMEOUT_SECONDS,
                )
                worker.cancel()
                await asyncio.wait({worker}, timeout=_CLOSE_TIMEOUT_SECONDS)

    def _on_worker_done(self, worker: asyncio.Task[None]) -> None:
        """Log a session that died on its own (transport failure), marking the error retrieved."""
        if worker.cancelled():
            return
        failure = worker.exception()
        if failure is not None:
            logger.warning(
                "MCP server %r: session ended with an error: %s",
                self.config.alias,
                _describe(failure),
                exc_info=failure,
            )

    def _require_client(self) -> Client:
        """The live SDK client.

        Raises:
            RuntimeError: Not entered yet, or used from another event loop.
            ToolError: ``mcp_error``: the session is closed or its transport failed.
        """
        if self._worker is None:
            raise RuntimeError(f"McpConnection {self.config.alias!r} is not open; use `async with`")
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(f"McpConnection {self.config.alias!r} used from a different event loop")
        client = self._client
        if client is None or self._worker.done():
            raise ToolError(
                f"The connection to MCP server {self.config.alias!r} is closed; its tools are unavailable.",
                code="mcp_error",
            )
        return client

    # --- operations -------------------------------------------------------------------------

    async def list_tools(self) -> list[McpToolInfo]:
        """List every tool of the server (see :func:`list_all_tools`).

        Raises:
            ToolError: ``timeout``, or ``mcp_error`` for a protocol or transport error.
            RuntimeError: Not open, or used from another event loop.
        """
        tools = await list_all_tools(self._require_client(), self.config, http_log=self.http_log)
        self._list_attempted = True
        return tools

    async def _ensure_listed(self) -> None:
        """List the tools once before the first call on this connection.

        The SDK validates a successful result against the tool's output schema, which it
        learns from ``tools/list``; for a tool it has not seen listed it re-fetches the
        *first* page on every call (an extra round trip and a warning per call for tools on
        later pages). One full listing up front avoids that. Bounded by
        ``list_timeout_seconds``, not by the call's timeout; attempted once; a failure is
        logged and the call proceeds.
        """
        if self._list_attempted:
            return
        async with self._list_lock:
            if self._list_attempted:
                return
            try:
                await self.list_tools()
            except ToolError as exc:
                logger.warning(
                    "MCP server %r: listing tools before the first call failed: %s", self.config.alias, exc.message
                )
            finally:
                self._list_attempted = True

    async def call_tool_raw(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_seconds: float,
        progress: ProgressCallback | None = None,
    ) -> mcp_types.CallToolResult:
        """Like :meth:`call_tool` but returns the SDK's successful ``CallToolResult`` unmapped.

        ``progress`` is awaited for each progress notification of this call. Same errors as
        :meth:`call_tool`.
        """
        check_timeout_seconds(timeout_seconds, what="timeout_seconds")
        self._require_client()
        await self._ensure_listed()
        return await call_tool_raw(
            self._require_client(), self.config, name, arguments, timeout_seconds=timeout_seconds, progress=progress,
            http_log=self.http_log,
        )

    async def call_tool(self, name: str, arguments: dict[str, Any], *, timeout_seconds: float) -> ToolResult:
        """Call one tool and map its result for the model.

        Mapping: text blocks are joined (newline) into ``content``; image, audio and resource
        blocks appear as summaries such as ``[image image/png, 1234 bytes]``;
        ``structuredContent`` becomes ``data`` and, when there is no text block, also leads
        ``content`` as JSON.

        The first call on a connection that has not listed its tools yet lists them first
        (see ``_ensure_listed``), bounded by ``list_timeout_seconds`` on top of
        ``timeout_seconds``.

        Args:
            name: The server's tool name (``McpToolInfo.name``, not the exposed name).
            arguments: JSON-serialisable arguments object.
            timeout_seconds: Bound on the whole call, positive and finite. On expiry the SDK
                sends the server a cancellation notification.

        Returns:
            ``ToolResult(content: str, data: JSON value | None)``.

        Raises:
            ToolError: ``mcp_tool_error`` when the server returned ``isError`` (message: the
                tool's error text); ``timeout`` after ``timeout_seconds``; ``mcp_error`` for a
                protocol or transport error (unknown tool, bad result, connection closed).
            ValueError: ``timeout_seconds`` is not a positive finite number.
            RuntimeError: Not open, or used from another event loop.
        """
        check_timeout_seconds(timeout_seconds, what="timeout_seconds")
        self._require_client()
        await self._ensure_listed()
        result = await call_tool_raw(
            self._require_client(), self.config, name, arguments, timeout_seconds=timeout_seconds,
            http_log=self.http_log,
        )
        return _to_tool_result(result)
