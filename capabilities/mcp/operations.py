"""The two requests a run makes of an entered SDK client: list every tool
(:func:`list_all_tools`, all pages) and call one (:func:`call_tool_raw`), each bounded, with
the SDK's and the transport's failures turned into :class:`~capabilities.tools.ToolError` s
(:class:`~capabilities.mcp.errors.McpConnectionLost` when the transport is gone).

Used by :class:`~capabilities.mcp.client.McpConnection` and by the pool's sessions
(:mod:`capabilities.mcp.pool`). No Django imports.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, HEADER_MISMATCH, LOG_LEVEL_META_KEY, REQUEST_TIMEOUT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from capabilities.mcp.call_hooks import CallHooks
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.elicitation import (
    URL_ELICITATION_REQUIRED,
    HeldCall,
    elicitation_from_input_required,
    elicitation_from_url_required,
)
from capabilities.mcp.errors import McpConnectionLost, describe_exception
from capabilities.mcp.http_log import HttpStatusLog, http_error_message
from capabilities.mcp.results import error_text
from capabilities.mcp.sampling import answer_sampling_rounds
from capabilities.tools import ToolError

logger = logging.getLogger(__name__)

_MAX_LIST_PAGES = 1_000
"""Upper bound on ``tools/list`` pages, against a server whose cursors never end."""

ProgressCallback = Callable[[float, "float | None", "str | None"], Awaitable[None]]
"""``await progress(progress, total, message)``: a server progress notification for one call."""


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool as an MCP server lists it."""

    name: str
    """The server's own tool name (pass it to ``call_tool``; not the exposed name)."""
    description: str
    """The server's description ('' when it gave none)."""
    input_schema: dict[str, Any]
    """JSON Schema of the arguments, as the server sent it (see ``tool.normalize_input_schema``)."""


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
        raise McpConnectionLost(f"MCP server {alias!r} failed to list its tools: {describe_exception(exc)}") from exc
    except ValidationError as exc:
        raise ToolError(
            f"MCP server {alias!r} failed to list its tools: {describe_exception(exc)}", code="mcp_error"
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
    resume: dict[str, Any] | None = None,
    hold: HeldCall | None = None,
    hooks: CallHooks | None = None,
) -> mcp_types.CallToolResult:
    """Call one tool; return its successful result unmapped.

    A server that asks the person for input (2026-07-28 ``InputRequiredResult`` with an
    elicitation, or error ``-32042`` URL elicitation required) raises
    :class:`~capabilities.tools.InputForUser`; the call is made again later with ``resume``
    (:func:`capabilities.mcp.elicitation.resume_arguments` of the answer).

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
        resume: ``{input_responses, request_state}`` answering an earlier ``InputRequiredResult``.
        hold: A 2025-11-25 call held open while its server asks the person: its timeout scope
            is handed to ``hold`` (stopped while the person is asked).
        hooks: The call's log level and sampling answerer: on a 2026-07-28 connection the call
            opts in to log messages at ``hooks.log_level`` (``_meta``), and an
            ``InputRequiredResult`` asking for sampling is answered and the call sent again
            (:func:`capabilities.mcp.sampling.answer_sampling_rounds`), or, when the binding
            wants each approved, the person is asked (``InputForUser``, ``type: sampling``).

    Returns:
        The ``CallToolResult`` (never one with ``isError``).

    Raises:
        ToolError: ``mcp_tool_error`` when the server returned ``isError`` (message: the
            tool's error text); ``timeout`` after ``timeout_seconds``; ``mcp_error`` for a
            protocol error (unknown tool, bad result, an input request other than an
            elicitation).
        InputForUser: The server asks the person (form or URL elicitation).
        McpConnectionLost: The transport failed or the session closed during the call.

    A refused 2026-07-28 sampling request fails the call (``ToolError`` ``sampling_refused``).
    """
    alias = config.alias
    errors_before = http_log.errors if http_log is not None else 0
    timeout_message = f"MCP tool {name!r} timed out after {timeout_seconds:g} s"
    try:
        # Two bounds: the SDK's own read timeout (sends the courtesy cancel) and an outer
        # one covering what the SDK does not time (writing the request, output validation).
        with _bound(timeout_seconds, hold):
            result = await _send_call(client, name, arguments, timeout_seconds, progress, resume or {}, hold, hooks)
    except TimeoutError:
        raise ToolError(timeout_message, code="timeout") from None
    except MCPError as exc:
        _raise_url_elicitation(exc, alias=alias, tool_name=name)
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
        raise ToolError(f"MCP server {alias!r}: tool {name!r} failed: {describe_exception(exc)}", code="mcp_error") from exc
    if isinstance(result, mcp_types.InputRequiredResult):
        ask = elicitation_from_input_required(result, server=alias, tool_name=name)
        if ask is None:
            raise ToolError(f"MCP server {alias!r}: tool {name!r} asked for input the platform does not give "
                            "(sampling or roots); it cannot be used here.", code="mcp_error")
        raise ask
    if result.is_error:
        raise ToolError(error_text(result, name), code="mcp_tool_error")
    return result


@contextlib.contextmanager
def _bound(timeout_seconds: float, hold: HeldCall | None) -> Iterator[anyio.CancelScope]:
    """The call's timeout scope (``anyio.fail_after``: TimeoutError on expiry), handed to
    ``hold`` if any."""
    with anyio.fail_after(timeout_seconds) as scope:
        if hold is not None:
            hold.scope = scope
        yield scope


def _raise_url_elicitation(exc: MCPError, *, alias: str, tool_name: str) -> None:
    """Raise :class:`InputForUser` for a ``-32042`` error (URL elicitation required) that names
    an http(s) URL; return for any other error."""
    if exc.code == URL_ELICITATION_REQUIRED:
        ask = elicitation_from_url_required(exc.error.data, server=alias, tool_name=tool_name)
        if ask is not None:
            raise ask from None


async def _send_call(
    client: Client, name: str, arguments: dict[str, Any], timeout_seconds: float, progress: ProgressCallback | None,
    resume: dict[str, Any], hold: HeldCall | None = None, hooks: CallHooks | None = None,
) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
    """One ``tools/call`` round that may answer ``InputRequiredResult`` (an elicitation is not
    driven here: the person's answer comes after a pause; sampling is, with ``hooks``). A
    2026-07-28 ``HEADER_MISMATCH`` (our listing of the tool is stale) re-lists the tools and
    sends once more, as ``Client.call_tool`` does. A held call (``hold``) gives the SDK's read
    timeout the person's time too (our own scope, whose deadline stops while the person is
    asked, is the call's bound)."""
    read_timeout = timeout_seconds + hold.wait_seconds if hold is not None else timeout_seconds
    modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
    base = {**resume, "meta": {LOG_LEVEL_META_KEY: hooks.log_level}} if hooks is not None and modern else resume

    async def send(extra: dict[str, Any]) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        return await client.session.call_tool(  # validates a result against the listed output schema
            name, arguments, read_timeout_seconds=read_timeout, progress_callback=progress,
            allow_input_required=True, **extra,
        )

    try:
        result = await send(base)
    except MCPError as exc:
        if exc.code != HEADER_MISMATCH or not modern:
            raise
        await client.list_tools(cache_mode="refresh")
        result = await send(base)
    if hooks is None:
        return result
    return await answer_sampling_rounds(
        result, answer=hooks.answer_sampling, server=hooks.server, ask=hooks.ask_approval,
        retry=lambda responses, state: send({**base, "input_responses": responses, "request_state": state}),
    )
