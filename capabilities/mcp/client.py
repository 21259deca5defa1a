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

The parts it is made of, each its own module of :mod:`capabilities.mcp`: the server's
configuration (``config``), the SDK client over its transport (``transport``, with
``http_log`` and ``tool_list_filter`` for remote servers), the list and call requests
(``operations``), the mapping of results for the model (``results``) and the errors
(``errors``). The pool (``pool``) keeps long-lived sessions from the same parts; this
connection remains for the console's Test connection and for tests.

No Django imports: the runner, the pool and tests use this directly.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import mcp_types
from mcp import Client

from capabilities.mcp.config import McpServerConfig, check_timeout_seconds
from capabilities.mcp.errors import McpConnectError, connect_failure_text, describe_exception
from capabilities.mcp.http_log import HttpStatusLog
from capabilities.mcp.operations import McpToolInfo, ProgressCallback, call_tool_raw, list_all_tools
from capabilities.mcp.results import to_tool_result
from capabilities.mcp.transport import StderrTail, make_client
from capabilities.tools import ToolError, ToolResult

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_SECONDS = 10.0
"""How long ``__aexit__`` waits for the owner task to close the session before cancelling it.
The SDK's stdio shutdown is itself bounded (about 6.5 s worst case: stdin close, SIGTERM,
SIGKILL), and it is shielded, so the cancel cannot leak the server process."""


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
        self._stderr: StderrTail | None = None
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
                describe_exception(failure),
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
        resume: dict[str, Any] | None = None,
    ) -> mcp_types.CallToolResult:
        """Like :meth:`call_tool` but returns the SDK's successful ``CallToolResult`` unmapped.

        ``progress`` is awaited for each progress notification of this call; ``resume``
        answers the server's earlier request for input (:mod:`capabilities.mcp.elicitation`).
        Same errors as :meth:`call_tool`, and ``InputForUser`` when the server asks the person.
        """
        check_timeout_seconds(timeout_seconds, what="timeout_seconds")
        self._require_client()
        await self._ensure_listed()
        return await call_tool_raw(
            self._require_client(), self.config, name, arguments, timeout_seconds=timeout_seconds, progress=progress,
            http_log=self.http_log, resume=resume,
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
        return to_tool_result(result)
