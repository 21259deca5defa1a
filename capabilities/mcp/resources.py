"""An MCP server's resources, through a pooled session: ``resources/list`` and
``resources/templates/list`` (every page, cached per session like the tool catalogue) and
``resources/read`` (text and blob contents, under a size cap).

:class:`ResourceCache` is a pooled session's ``resources``
(:class:`capabilities.mcp.pool.PooledSession`): the listing is kept until the server announces
``notifications/resources/list_changed`` (a plain notification on handshake-era connections, a
``subscriptions/listen`` event on 2026-07-28 ones; the pool routes both to
:meth:`ResourceCache.mark_changed`), or ``notifications/resources/updated`` for one of them
(:meth:`ResourceCache.mark_updated`: its size, title or type may have changed), or it is older
than the pool's ``catalogue_ttl_seconds``. A server that does not declare the ``resources``
capability has none (nothing is asked).

**Subscriptions.** The platform reads a resource once, when the run it was attached to starts
(:mod:`capabilities.mcp.kind`), and never keeps a resource's contents: there is nothing to keep
fresh, so it does not send ``resources/subscribe`` (2025-11-25) nor ask for
``resourceSubscriptions`` on the listen stream (2026-07-28). What a subscription would bring,
``notifications/resources/updated``, is still handled when a server sends it: the listing is
read again on next use.

The SDK's and the transport's failures become :class:`~capabilities.tools.ToolError` s as in
:mod:`capabilities.mcp.operations` (:class:`~capabilities.mcp.errors.McpConnectionLost` when the
transport is gone). No Django imports. Spec: MCP "Resources" (2025-11-25, 2026-07-28).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mcp_types
from mcp import Client

from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.errors import McpConnectionLost
from capabilities.mcp.prompts import mcp_request_errors
from capabilities.tools import ToolError

if TYPE_CHECKING:
    from capabilities.mcp.pool import PooledSession

logger = logging.getLogger(__name__)

_MAX_LIST_PAGES = 1_000
"""Upper bound on the pages of one listing, against a server whose cursors never end."""
DEFAULT_RESOURCE_MAX_BYTES = 4 * 1024 * 1024
"""Setting ``MCP_RESOURCE_MAX_BYTES``: the most a read resource may hold (its contents' text in
UTF-8 plus their decoded blobs, bytes); a larger one is refused with ``resource_too_large``."""
MAX_URI_CHARS = 2_000
"""The longest resource URI the platform accepts (attachments, reads)."""


@dataclass(frozen=True, slots=True)
class McpResourceInfo:
    """One resource, or resource template, as an MCP server lists it."""

    uri: str
    """The resource's URI; for a template its RFC 6570 URI template (``file:///logs/{date}``)."""
    name: str
    title: str = ""
    description: str = ""
    mime_type: str = ""
    size: int | None = None
    """Bytes, when the server says (resources only)."""
    template: bool = False
    """A template (``resources/templates/list``): fill its variables in to get a URI to read."""

    def as_json(self) -> dict[str, Any]:
        """``{uri, name, title, description, mime_type, size, template}``."""
        return {"uri": self.uri, "name": self.name, "title": self.title, "description": self.description,
                "mime_type": self.mime_type, "size": self.size, "template": self.template}

    def matches(self, terms: list[str]) -> bool:
        """Whether every one of ``terms`` (lowercase) is in the name, title, URI or description."""
        haystack = f"{self.name}\n{self.title}\n{self.uri}\n{self.description}".lower()
        return all(term in haystack for term in terms)


@dataclass(frozen=True, slots=True)
class ResourceCatalogue:
    """The resources and templates a server listed (all pages)."""

    resources: tuple[McpResourceInfo, ...]
    templates: tuple[McpResourceInfo, ...]
    fetched_at: float
    """The pool's clock (monotonic seconds) when the listing finished."""

    def search(self, query: str = "") -> list[McpResourceInfo]:
        """Resources then templates whose name, title, URI or description hold every word of
        ``query`` (case-insensitive; "" : all)."""
        terms = query.lower().split()
        return [item for item in (*self.resources, *self.templates) if item.matches(terms)]


@dataclass(frozen=True, slots=True)
class ResourceContent:
    """One item of a ``resources/read`` answer: ``text`` or ``data`` (a decoded blob)."""

    uri: str
    mime_type: str
    text: str | None = None
    data: bytes | None = None

    @property
    def size_bytes(self) -> int:
        """The text in UTF-8 or the blob, bytes."""
        return len(self.text.encode("utf-8")) if self.text is not None else len(self.data or b"")


class ResourceTooLarge(ToolError):
    """A read resource holds more than the cap (``code`` ``resource_too_large``; the message
    names the resource, its size and the limit)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="resource_too_large")


def _info(item: mcp_types.Resource | mcp_types.ResourceTemplate) -> McpResourceInfo:
    template = isinstance(item, mcp_types.ResourceTemplate)
    return McpResourceInfo(
        uri=item.uri_template if template else item.uri, name=item.name, title=item.title or "",
        description=item.description or "", mime_type=item.mime_type or "",
        size=None if template else item.size, template=template,
    )


async def _list_pages(config: McpServerConfig, what: str, fetch: Any, items_of: Any) -> list[McpResourceInfo]:
    """Every page of one listing (``fetch(cursor)`` → page, ``items_of(page)`` → its items);
    a URI listed twice is kept once (the first)."""
    found: list[McpResourceInfo] = []
    seen_uris: set[str] = set()
    seen_cursors: set[str] = set()
    cursor: str | None = None
    with mcp_request_errors(config, f"list its {what}", config.list_timeout_seconds):
        for _ in range(_MAX_LIST_PAGES):
            page = await fetch(cursor)
            for item in items_of(page):
                info = _info(item)
                if info.uri not in seen_uris:
                    seen_uris.add(info.uri)
                    found.append(info)
            cursor = page.next_cursor
            if not cursor:
                return found
            if cursor in seen_cursors:
                raise ToolError(f"MCP server {config.alias!r} repeated a cursor listing its {what}", code="mcp_error")
            seen_cursors.add(cursor)
    raise ToolError(f"MCP server {config.alias!r} returned more than {_MAX_LIST_PAGES} pages of {what}",
                    code="mcp_error")


async def list_all_resources(client: Client, config: McpServerConfig) -> list[McpResourceInfo]:
    """Every resource of the server (``resources/list``, following ``nextCursor``), bounded
    by ``config.list_timeout_seconds`` and 1,000 pages.

    Raises:
        ToolError: ``timeout``; ``mcp_error`` (a protocol error, a repeated cursor, too many
            pages). McpConnectionLost: the transport failed.
    """
    return await _list_pages(config, "resources", lambda cursor: client.list_resources(cursor=cursor),
                             lambda page: page.resources)


async def list_all_resource_templates(client: Client, config: McpServerConfig) -> list[McpResourceInfo]:
    """Every resource template of the server (``resources/templates/list``), as
    :func:`list_all_resources` (same bounds and errors)."""
    return await _list_pages(config, "resource templates",
                             lambda cursor: client.list_resource_templates(cursor=cursor),
                             lambda page: page.resource_templates)


def _content(item: Any, config: McpServerConfig, uri: str) -> ResourceContent:
    """One item of a read answer; a blob that is not base64 is a ToolError ``mcp_error``."""
    mime_type = item.mime_type or ""
    if isinstance(item, mcp_types.TextResourceContents):
        return ResourceContent(uri=item.uri, mime_type=mime_type or "text/plain", text=item.text)
    try:
        data = base64.b64decode(item.blob, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError(f"MCP server {config.alias!r} sent {uri!r} as a blob that is not base64",
                        code="mcp_error") from None
    return ResourceContent(uri=item.uri, mime_type=mime_type or "application/octet-stream", data=data)


async def read_resource(client: Client, config: McpServerConfig, uri: str, *,
                        max_bytes: int = DEFAULT_RESOURCE_MAX_BYTES) -> tuple[ResourceContent, ...]:
    """``resources/read`` of ``uri``, bounded by ``config.call_timeout_seconds``.

    Args:
        uri: The resource's URI (a template's, filled in).
        max_bytes: The most the contents may hold in all (text in UTF-8, decoded blobs).

    Returns:
        The contents (a server may answer several items for one URI, e.g. a directory's files).

    Raises:
        ResourceTooLarge: more than ``max_bytes`` (the whole answer was received: a transport
            reads a message whole; the cap keeps it out of the model and the database).
        ToolError: ``timeout``; ``mcp_error`` (unknown resource: the server's message; a bad
            blob; no contents). McpConnectionLost: the transport failed.
    """
    with mcp_request_errors(config, f"read the resource {uri!r}", config.call_timeout_seconds):
        result = await client.read_resource(uri)
    contents = tuple(_content(item, config, uri) for item in result.contents)
    if not contents:
        raise ToolError(f"MCP server {config.alias!r} sent no contents for the resource {uri!r}", code="mcp_error")
    size = sum(c.size_bytes for c in contents)
    if size > max_bytes:
        raise ResourceTooLarge(
            f"The resource {uri!r} of MCP server {config.alias!r} holds {size:,} bytes, more than the "
            f"{max_bytes:,}-byte limit for a resource; attach a smaller one."
        )
    return contents


class ResourceCache:
    """The resources of one pooled session (``PooledSession.resources``). Use from the pool's loop."""

    def __init__(self, session: PooledSession) -> None:
        self._session = session
        self._catalogue: ResourceCatalogue | None = None
        self._changes = 0
        self._catalogue_changes = 0
        self._listing: asyncio.Task[ResourceCatalogue] | None = None
        self.updates: list[str] = []
        """URIs the server said were updated (``notifications/resources/updated``), last 100."""
        self.changed = asyncio.Event()
        """Set (and replaced by a fresh event) on every change the server announces."""

    def mark_changed(self) -> None:
        """The server announced ``resources/list_changed``: the next :meth:`list` asks again."""
        self._changes += 1
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def mark_updated(self, uri: str) -> None:
        """The server announced ``resources/updated`` for ``uri``: the listing is read again on
        next use (the resource's size, title or type may have changed)."""
        self.updates = [*self.updates[-99:], uri]
        self.mark_changed()

    async def _capabilities(self) -> mcp_types.ServerCapabilities:
        """The server's capabilities (connecting first if needed)."""
        await self._session.connect()
        return self._session.server_capabilities or mcp_types.ServerCapabilities()

    async def list(self, *, refresh: bool = False) -> ResourceCatalogue:
        """The server's resources and templates: listed (all pages of both) when missing,
        announced changed, older than the pool's ``catalogue_ttl_seconds``, or ``refresh``;
        empty when the server has no ``resources`` capability. Concurrent callers share one
        listing; a cancelled caller does not cancel it.

        Raises:
            ToolError: ``timeout`` / ``mcp_error`` listing; McpConnectError; McpServerUnavailable.
        """
        pool = self._session.pool
        if (await self._capabilities()).resources is None:
            return ResourceCatalogue(resources=(), templates=(), fetched_at=pool.clock())
        current = self._catalogue
        if (current is not None and not refresh and self._catalogue_changes == self._changes
                and pool.clock() - current.fetched_at < pool.catalogue_ttl_seconds):
            return current
        if self._listing is None or self._listing.done():
            self._listing = asyncio.get_running_loop().create_task(self._refresh(), context=contextvars.Context())
            self._listing.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(self._listing)

    async def _refresh(self) -> ResourceCatalogue:
        changes, config = self._changes, self._session.config

        async def listing(client: Client) -> tuple[list[McpResourceInfo], list[McpResourceInfo]]:
            resources = await list_all_resources(client, config)
            try:
                templates = await list_all_resource_templates(client, config)
            except ToolError as exc:  # some servers list resources but answer no templates/list
                if isinstance(exc, McpConnectionLost) or exc.code == "timeout":
                    raise
                logger.info("MCP server %r: no resource templates: %s", config.alias, exc.message)
                templates = []
            return resources, templates

        resources, templates = await self._session.submit(listing)
        self._catalogue = ResourceCatalogue(resources=tuple(resources), templates=tuple(templates),
                                            fetched_at=self._session.pool.clock())
        self._catalogue_changes = changes
        return self._catalogue

    async def read(self, uri: str, *, max_bytes: int = DEFAULT_RESOURCE_MAX_BYTES) -> tuple[ResourceContent, ...]:
        """``resources/read`` on the session (see :func:`read_resource`).

        Raises:
            ToolError: ``mcp_error`` when the server has no ``resources`` capability; see
                :func:`read_resource`; McpConnectError; McpServerUnavailable.
        """
        config = self._session.config
        if (await self._capabilities()).resources is None:
            raise ToolError(f"MCP server {config.alias!r} offers no resources", code="mcp_error")
        return await self._session.submit(lambda client: read_resource(client, config, uri, max_bytes=max_bytes))
