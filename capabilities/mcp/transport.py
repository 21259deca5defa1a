"""How an MCP connection reaches its server: the SDK client over stdio (a confined process),
legacy SSE or Streamable HTTP (:func:`make_client`).

A stdio server is always started confined (:mod:`capabilities.confinement`) and its stderr is
drained by :class:`StderrTail` (the last lines go into connect-error messages). A remote server
is dialled through the outbound address rules (:func:`capabilities.netsafe.outbound_transport`),
with its HTTP errors recorded (:class:`~capabilities.mcp.http_log.HttpStatusLog`) and malformed
tools taken out of its listings (:class:`~capabilities.mcp.tool_list_filter.ToolListFilter`).

No Django imports.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import IO, Any

import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from capabilities.confinement import confined_argv, confined_env
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.elicitation import answer_legacy_elicitation
from capabilities.mcp.http_log import HttpStatusLog
from capabilities.mcp.tool_list_filter import ToolListFilter
from capabilities.mcp.transport_end import TransportEnd, watched

logger = logging.getLogger(__name__)

_HTTP_READ_TIMEOUT_SECONDS = 300.0
"""httpx read timeout (the SDK's default): a response stream that stays silent longer fails.
A tool call longer than this on a server that answers with plain JSON (no SSE keep-alive)
would fail the whole connection, so call timeouts should stay below it."""

_IDLE_CLOSE_MARGIN_SECONDS = 60.0
"""How much longer than the pool's idle close a quiet stream may stay silent."""


def stream_read_timeout_seconds() -> float:
    """The read timeout of a remote server's streams (the legacy SSE stream, Streamable HTTP
    responses): the longer of :data:`_HTTP_READ_TIMEOUT_SECONDS` and the pool's idle close
    (``MCP_POOL_IDLE_TIMEOUT_SECONDS``) plus :data:`_IDLE_CLOSE_MARGIN_SECONDS`.

    A pooled legacy-SSE session that nobody uses hears nothing from its server; with both at
    300 s its stream's read timeout raced the pool's idle close and often won, ending the
    session with an ERROR traceback, and a longer idle setting made it always win. Now the pool
    closes a quiet session first, however long its idle setting (issue 37). A tool call is
    bounded by its own call timeout, not by this."""
    from django.conf import settings

    idle = float(getattr(settings, "MCP_POOL_IDLE_TIMEOUT_SECONDS", 0.0) or 0.0)
    return max(_HTTP_READ_TIMEOUT_SECONDS, idle + _IDLE_CLOSE_MARGIN_SECONDS)


_STDERR_TAIL_LINES = 20
"""Lines of a stdio server's stderr kept for connect-error messages."""

_CLIENT_INFO = mcp_types.Implementation(name="agent-platform", version="0.1.0")


class StderrTail:
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


def checked_http_client(
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
    elicitation_callback: Callable[[Any, Any], Awaitable[Any]] = answer_legacy_elicitation,
    logging_callback: Callable[[Any], Awaitable[None]] | None = None,
    sampling_callback: Callable[[Any, Any], Awaitable[Any]] | None = None,
) -> tuple[Client, StderrTail | None]:
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
        elicitation_callback: A 2025-11-25 server's ``elicitation/create`` inside an open call
            (default: declined at once; the pool holds the call open instead,
            :class:`capabilities.mcp.elicitation.HeldCall`).
        logging_callback: The server's ``notifications/message`` (the pool's: kept by the call
            in flight, :mod:`capabilities.mcp.call_hooks`); None: ignored.
        sampling_callback: A 2025-11-25 server's ``sampling/createMessage`` inside an open call;
            given, the client declares the ``sampling`` capability with ``tools`` (each binding
            decides what it answers, :mod:`capabilities.mcp.sampling`); None: not declared.

    Remote servers (sse / streamable_http) are reached through the outbound address rules
    (``capabilities.netsafe``): a URL that resolves to loopback, a private or link-local
    network or a metadata address fails the connect, unless an operator allowed it.

    Returns:
        ``(client, stderr_tail)``; ``stderr_tail`` is None except for stdio servers.
    """
    stderr: StderrTail | None = None
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
        stderr = StderrTail(config.alias)
        stack.callback(stderr.close_writer)
        transport: Any = stdio_client(params, errlog=stderr.writer)  # type: ignore[arg-type]
    elif config.transport == "sse":
        transport = sse_client(
            config.url,
            headers=dict(config.headers),
            timeout=config.connect_timeout_seconds,
            sse_read_timeout=stream_read_timeout_seconds(),
            httpx_client_factory=lambda headers=None, timeout=None, auth=None: checked_http_client(
                headers, timeout, auth or config.auth, http_log),
        )
    else:
        # What the SDK's own default client is, plus our headers and connect timeout.
        # Redirects stay off: the SDK follows same-origin ones itself.
        http_client = checked_http_client(
            config.headers, httpx2.Timeout(config.connect_timeout_seconds, read=stream_read_timeout_seconds()),
            config.auth, http_log,
        )
        stack.push_async_callback(http_client.aclose)
        transport = streamable_http_client(config.url, http_client=http_client)
    if transport_end is not None:
        transport = watched(transport, transport_end)
    # cache=None: every list_tools reaches the server (we keep our own catalogue).
    # The elicitation callback declares the capability (2026-07-28 servers then ask through
    # InputRequiredResult: capabilities.mcp.elicitation) and answers 2025-11-25 requests.
    client = Client(
        transport, cache=None, client_info=_CLIENT_INFO, message_handler=message_handler, mode=config.protocol_mode,
        elicitation_callback=elicitation_callback, logging_callback=logging_callback,
        sampling_callback=sampling_callback,
        sampling_capabilities=mcp_types.SamplingCapability(tools=mcp_types.SamplingToolsCapability())
        if sampling_callback is not None else None,
    )
    return client, stderr
