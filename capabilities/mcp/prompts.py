"""An MCP server's prompts, through a pooled session: ``prompts/list`` (every page, cached per
session like the tool catalogue), ``prompts/get`` and ``completion/complete``.

:class:`PromptCache` is a pooled session's ``prompts`` (:class:`capabilities.mcp.pool.PooledSession`):
the listing is kept until the server announces ``notifications/prompts/list_changed`` (a plain
notification on handshake-era connections, a ``subscriptions/listen`` event on 2026-07-28 ones;
the pool routes both to :meth:`PromptCache.mark_changed`) or it is older than the pool's
``catalogue_ttl_seconds``. A server that does not declare the ``prompts`` capability has no
prompts (nothing is asked); one without ``completions`` completes nothing.

The SDK's and the transport's failures become :class:`~capabilities.tools.ToolError` s as in
:mod:`capabilities.mcp.operations` (:class:`~capabilities.mcp.errors.McpConnectionLost` when the
transport is gone). No Django imports. Spec: MCP "Prompts" and "Completion" (2025-11-25, 2026-07-28).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.errors import McpConnectionLost, describe_exception
from capabilities.tools import ToolError

if TYPE_CHECKING:
    from capabilities.mcp.pool import PooledSession

logger = logging.getLogger(__name__)

_MAX_LIST_PAGES = 1_000
"""Upper bound on ``prompts/list`` pages, against a server whose cursors never end."""
MAX_COMPLETION_VALUES = 100
"""The spec's cap on the values of one ``completion/complete`` answer."""


@dataclass(frozen=True, slots=True)
class McpPromptArgument:
    """One argument of a prompt, as the server lists it."""

    name: str
    description: str = ""
    required: bool = False

    def as_json(self) -> dict[str, Any]:
        """``{name, description, required}``."""
        return {"name": self.name, "description": self.description, "required": self.required}


@dataclass(frozen=True, slots=True)
class McpPromptInfo:
    """One prompt (or prompt template) as an MCP server lists it."""

    name: str
    """The server's own name (pass it to ``prompts/get``)."""
    title: str = ""
    description: str = ""
    arguments: tuple[McpPromptArgument, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """``{name, title, description, arguments: [{name, description, required}]}``."""
        return {"name": self.name, "title": self.title, "description": self.description,
                "arguments": [a.as_json() for a in self.arguments]}


@dataclass(frozen=True, slots=True)
class PromptCatalogue:
    """The prompts a server listed (all pages)."""

    prompts: tuple[McpPromptInfo, ...]
    fetched_at: float
    """The pool's clock (monotonic seconds) when the listing finished."""
    connects: int = 0
    """The session's connect count then: a reconnected server (a restarted process) is asked again."""


@dataclass(frozen=True, slots=True)
class Completions:
    """What ``completion/complete`` answered: at most 100 ``values``; ``has_more``: the server
    has more than it sent."""

    values: tuple[str, ...] = ()
    has_more: bool = False


@contextlib.contextmanager
def mcp_request_errors(config: McpServerConfig, what: str, timeout_seconds: float) -> Iterator[None]:
    """Bound the block by ``timeout_seconds`` and turn the SDK's failures into ToolErrors whose
    message names the server and ``what`` was asked (``list its prompts``). Shared by
    :mod:`capabilities.mcp.resources`."""
    alias = config.alias
    try:
        with anyio.fail_after(timeout_seconds):
            yield
    except TimeoutError:
        raise ToolError(f"MCP server {alias!r} did not {what} within {timeout_seconds:g} s", code="timeout") from None
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            raise McpConnectionLost(f"The connection to MCP server {alias!r} closed: {exc.message}") from exc
        raise ToolError(f"MCP server {alias!r} failed to {what}: {exc.message}", code="mcp_error") from exc
    except (RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
        # RuntimeError: the SDK's "used outside its context" when the session just closed.
        raise McpConnectionLost(f"MCP server {alias!r} failed to {what}: {describe_exception(exc)}") from exc
    except ValidationError as exc:
        raise ToolError(f"MCP server {alias!r} failed to {what}: {describe_exception(exc)}", code="mcp_error") from exc


def _prompt_info(prompt: mcp_types.Prompt) -> McpPromptInfo:
    return McpPromptInfo(
        name=prompt.name, title=prompt.title or "", description=prompt.description or "",
        arguments=tuple(
            McpPromptArgument(name=a.name, description=a.description or "", required=bool(a.required))
            for a in prompt.arguments or ()
        ),
    )


async def list_all_prompts(client: Client, config: McpServerConfig) -> list[McpPromptInfo]:
    """List every prompt of the server, following ``nextCursor`` across all pages.

    Bounded as a whole by ``config.list_timeout_seconds`` and by 1,000 pages; a name listed
    twice is kept once (the first).

    Returns:
        The prompts in server order.

    Raises:
        ToolError: ``timeout``; ``mcp_error`` for a protocol error, a repeated cursor or too
            many pages. McpConnectionLost: the transport failed.
    """
    prompts: list[McpPromptInfo] = []
    seen_names: set[str] = set()
    seen_cursors: set[str] = set()
    cursor: str | None = None
    with mcp_request_errors(config, "list its prompts", config.list_timeout_seconds):
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_prompts(cursor=cursor)
            for prompt in page.prompts:
                if prompt.name not in seen_names:
                    seen_names.add(prompt.name)
                    prompts.append(_prompt_info(prompt))
            cursor = page.next_cursor
            if not cursor:
                return prompts
            if cursor in seen_cursors:
                raise ToolError(f"MCP server {config.alias!r} repeated the prompts/list cursor {cursor!r}",
                                code="mcp_error")
            seen_cursors.add(cursor)
    raise ToolError(f"MCP server {config.alias!r} returned more than {_MAX_LIST_PAGES} pages of prompts",
                    code="mcp_error")


async def get_prompt(client: Client, config: McpServerConfig, name: str,
                     arguments: dict[str, str]) -> mcp_types.GetPromptResult:
    """``prompts/get`` of ``name`` with ``arguments``, bounded by ``config.call_timeout_seconds``.

    Raises:
        ToolError: ``timeout``; ``mcp_error`` (an unknown prompt, a missing argument: the
            server's message). McpConnectionLost: the transport failed.
    """
    with mcp_request_errors(config, f"give the prompt {name!r}", config.call_timeout_seconds):
        return await client.get_prompt(name, arguments)


async def complete_prompt_argument(
    client: Client, config: McpServerConfig, prompt: str, argument: str, value: str, context: dict[str, str],
) -> Completions:
    """``completion/complete`` for ``argument`` of ``prompt`` typed so far as ``value``
    (``context``: the other arguments' values), bounded by ``config.list_timeout_seconds``.

    Raises:
        ToolError: ``timeout`` / ``mcp_error``. McpConnectionLost: the transport failed.
    """
    with mcp_request_errors(config, f"complete {prompt}.{argument}", config.list_timeout_seconds):
        result = await client.complete(
            mcp_types.PromptReference(name=prompt), {"name": argument, "value": value}, context_arguments=context or None,
        )
    completion = result.completion
    values = tuple(str(v) for v in completion.values[:MAX_COMPLETION_VALUES])
    return Completions(values=values, has_more=bool(completion.has_more) or len(completion.values) > len(values))


class PromptCache:
    """The prompts of one pooled session (``PooledSession.prompts``). Use from the pool's loop."""

    def __init__(self, session: PooledSession) -> None:
        self._session = session
        self._catalogue: PromptCatalogue | None = None
        self._changes = 0
        self._catalogue_changes = 0
        self._listing: asyncio.Task[PromptCatalogue] | None = None
        self.changed = asyncio.Event()
        """Set (and replaced by a fresh event) on every ``prompts/list_changed`` from the server."""

    def mark_changed(self) -> None:
        """The server announced ``prompts/list_changed``: the next :meth:`list` asks again."""
        self._changes += 1
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    async def _capabilities(self) -> mcp_types.ServerCapabilities:
        """The server's capabilities (connecting first if needed)."""
        await self._session.connect()
        return self._session.server_capabilities or mcp_types.ServerCapabilities()

    async def list(self, *, refresh: bool = False) -> tuple[McpPromptInfo, ...]:
        """The server's prompts: listed (all pages) when missing, announced changed, listed on an
        earlier connection, older than the pool's ``catalogue_ttl_seconds``, or ``refresh``; none
        when the server has no
        ``prompts`` capability. Concurrent callers share one listing.

        Raises:
            ToolError: ``timeout`` / ``mcp_error`` listing; McpConnectError; McpServerUnavailable.
        """
        if (await self._capabilities()).prompts is None:
            return ()
        pool, current = self._session.pool, self._catalogue
        if (current is not None and not refresh and self._catalogue_changes == self._changes
                and current.connects == self._session.connects
                and pool.clock() - current.fetched_at < pool.catalogue_ttl_seconds):
            return current.prompts
        if self._listing is None or self._listing.done():
            self._listing = asyncio.get_running_loop().create_task(self._refresh(), context=contextvars.Context())
            self._listing.add_done_callback(lambda t: t.cancelled() or t.exception())
        return (await asyncio.shield(self._listing)).prompts

    async def _refresh(self) -> PromptCatalogue:
        changes, config = self._changes, self._session.config
        prompts = await self._session.submit(lambda client: list_all_prompts(client, config))
        self._catalogue = PromptCatalogue(prompts=tuple(prompts), fetched_at=self._session.pool.clock(),
                                          connects=self._session.connects)
        self._catalogue_changes = changes
        return self._catalogue

    async def get(self, name: str, arguments: dict[str, str]) -> mcp_types.GetPromptResult:
        """``prompts/get`` on the session (see :func:`get_prompt`)."""
        config = self._session.config
        return await self._session.submit(lambda client: get_prompt(client, config, name, arguments))

    async def complete(self, prompt: str, argument: str, value: str, context: dict[str, str]) -> Completions:
        """Completion values for an argument (see :func:`complete_prompt_argument`); none when
        the server has no ``completions`` capability."""
        if (await self._capabilities()).completions is None:
            return Completions()
        config = self._session.config
        return await self._session.submit(
            lambda client: complete_prompt_argument(client, config, prompt, argument, value, context))
