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

**Kept contents and subscriptions.** A resource attached to one message is read once, when its
run starts (:meth:`ResourceCache.read`). A resource *pinned* to a chat is read at the start of
every run of the chat (:mod:`capabilities.mcp.attached`), through :meth:`ResourceCache.read_kept`:
when the server declares ``resources.subscribe``, the session subscribes to the URI (2025-11-25:
``resources/subscribe`` on the pooled session; 2026-07-28: ``resourceSubscriptions`` on a
``subscriptions/listen`` stream of its own, :meth:`ResourceCache.listen_for_updates`, opened again
with the new set when a URI is added) and keeps the contents it read; a later run gets them
without asking the server until ``notifications/resources/updated`` names the URI (or a resource
under it), they are older than the pool's ``catalogue_ttl_seconds``, or the connection is new
(subscriptions belong to a connection: a new one reads afresh). A server without ``subscribe``,
or one that refuses the subscription, is read at every run start. What is kept is bounded per
pooled session (:data:`MAX_KEPT_RESOURCES` URIs, :data:`MAX_KEPT_BYTES` of contents; the least
recently used go first, and are unsubscribed). Unpinning does not unsubscribe: the subscription
ends with the connection (idle close) or when pushed out.

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
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

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
"""The longest resource URI the platform accepts (attachments, pins, reads)."""
MAX_KEPT_RESOURCES = 32
"""The most resources one pooled session stays subscribed to and keeps the contents of
(:meth:`ResourceCache.read_kept`); beyond, the least recently used is dropped and unsubscribed."""
MAX_KEPT_BYTES = 16 * 1024 * 1024
"""The most bytes of kept contents one pooled session holds (text in UTF-8 plus decoded blobs);
beyond, the least recently used contents are dropped (the subscription stays)."""
_RECENT_UPDATES = 100
"""Updates remembered to tell whether one came during a read (more during one read: not kept)."""


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
    _check_size(config, uri, sum(c.size_bytes for c in contents), max_bytes)
    return contents


def _check_size(config: McpServerConfig, uri: str, size: int, max_bytes: int) -> None:
    """Raises ResourceTooLarge when ``size`` (bytes) is over ``max_bytes``."""
    if size > max_bytes:
        raise ResourceTooLarge(
            f"The resource {uri!r} of MCP server {config.alias!r} holds {size:,} bytes, more than the "
            f"{max_bytes:,}-byte limit for a resource; attach a smaller one."
        )


def subscribable(capabilities: mcp_types.ServerCapabilities | None) -> bool:
    """Whether the server declares ``resources.subscribe`` (it sends ``resources/updated``)."""
    return capabilities is not None and capabilities.resources is not None and bool(capabilities.resources.subscribe)


def _covers(kept_uri: str, updated_uri: str) -> bool:
    """Whether an update of ``updated_uri`` concerns ``kept_uri``: the same URI, or one under it
    (the spec lets a server name a sub-resource of the URI subscribed to)."""
    return updated_uri == kept_uri or updated_uri.startswith(kept_uri.rstrip("/") + "/")


@dataclass(slots=True)
class _Kept:
    """The contents of one resource a pooled session keeps (:meth:`ResourceCache.read_kept`)."""

    contents: tuple[ResourceContent, ...]
    size_bytes: int
    fetched_at: float
    """The pool's clock (monotonic seconds) when read."""
    connection: int
    """``PooledSession.connects`` when read: kept contents of an earlier connection are not used."""
    stale: bool = False
    """The server said the resource was updated (or a listen stream was opened again: no replay)."""
    updated: bool = False
    """The server said the resource was updated (``resources/updated``) since it was read."""


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
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._kept_bytes = 0
        self._subscribed: OrderedDict[str, int] = OrderedDict()
        """URI → the connection (``session.connects``) it is subscribed on, least recently used first."""
        self._refused: dict[str, int] = {}
        """URI → the connection whose server refused (or did not honour) its subscription."""
        self._wanted: OrderedDict[str, None] = OrderedDict()
        """2026-07-28: the URIs the resource listen stream asks for (:meth:`listen_for_updates`)."""
        self._wanted_changed = asyncio.Event()
        self._acks: list[asyncio.Future[frozenset[str]]] = []
        """2026-07-28: callers waiting for the next listen stream's acknowledgement (its honoured URIs)."""
        self._update_seq = 0
        self._recent_updates: deque[tuple[int, str]] = deque(maxlen=_RECENT_UPDATES)
        self.kept_reads = 0
        """Reads answered from kept contents, without a request (tests, the benchmark)."""

    def mark_changed(self) -> None:
        """The server announced ``resources/list_changed``: the next :meth:`list` asks again."""
        self._changes += 1
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def mark_updated(self, uri: str) -> None:
        """The server announced ``resources/updated`` for ``uri``: its kept contents (and those of
        a resource it is under) are stale, and the listing is read again on next use (the
        resource's size, title or type may have changed)."""
        self.updates = [*self.updates[-99:], uri]
        self._update_seq += 1
        self._recent_updates.append((self._update_seq, uri))
        for kept_uri, kept in self._kept.items():
            if _covers(kept_uri, uri):
                kept.stale = kept.updated = True
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

    # --- kept contents and subscriptions (pinned resources) --------------------------------

    async def keep(self, uris: Iterable[str]) -> None:
        """Subscribe to ``uris`` (when the server declares ``resources.subscribe``) before they
        are read with :meth:`read_kept`: all at once, so that a 2026-07-28 listen stream is opened
        again once for them, not once per URI. A refused subscription is remembered for the
        connection (those URIs are read at every use); failures are logged, never raised."""
        try:
            capabilities = await self._capabilities()
        except ToolError as exc:
            logger.info("MCP server %r: no subscription: %s", self._session.config.alias, exc.message)
            return
        if not subscribable(capabilities):
            return
        connection = self._session.connects
        missing = [uri for uri in dict.fromkeys(uris)
                   if self._subscribed.get(uri) != connection and self._refused.get(uri) != connection]
        if not missing:
            return
        if self._session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            honoured = await self._listen_for(missing)
        else:
            honoured = frozenset([uri for uri in missing if await self._subscribe_legacy(uri)])
        for uri in missing:
            if uri in honoured:
                self._subscribed[uri] = connection
                self._subscribed.move_to_end(uri)
            else:
                self._refused[uri] = connection
        if len(self._refused) > 10 * MAX_KEPT_RESOURCES:
            self._refused.clear()
        await self._drop_least_used()

    async def read_kept(self, uri: str, *, max_bytes: int = DEFAULT_RESOURCE_MAX_BYTES
                        ) -> tuple[tuple[ResourceContent, ...], bool]:
        """The contents of ``uri``: those kept on this session when it is subscribed to it and
        they are neither stale (``resources/updated``), older than ``catalogue_ttl_seconds``, nor
        of an earlier connection; else ``resources/read`` (subscribing first, :meth:`keep`), kept
        for next time when subscribed and no update came during the read.

        Returns:
            ``(contents, kept)``: ``kept`` True when no request was made.

        Raises:
            ResourceTooLarge, ToolError: as :meth:`read` (kept contents over ``max_bytes``: too large).
        """
        config = self._session.config
        capabilities = await self._capabilities()
        if capabilities.resources is None:
            raise ToolError(f"MCP server {config.alias!r} offers no resources", code="mcp_error")
        if not subscribable(capabilities):
            return await self.read(uri, max_bytes=max_bytes), False
        kept = self._kept.get(uri)
        connection = self._session.connects
        if kept is not None and self._usable(uri, kept, connection):
            self._kept.move_to_end(uri)
            self._subscribed.move_to_end(uri)
            _check_size(config, uri, kept.size_bytes, max_bytes)
            self.kept_reads += 1
            return kept.contents, True
        await self.keep([uri])
        seq = self._update_seq
        contents = await self.read(uri, max_bytes=max_bytes)
        if (self._subscribed.get(uri) == connection == self._session.connects
                and not self._updated_since(seq, uri)):
            self._keep_contents(uri, contents, connection)
        return contents, False

    def announced_updated(self, uri: str) -> bool:
        """Whether the server said ``uri`` was updated since the contents this connection keeps
        were read (the next :meth:`read_kept` reads it again; the chat app says "updated")."""
        kept = self._kept.get(uri)
        return kept is not None and kept.updated and kept.connection == self._session.connects

    def _usable(self, uri: str, kept: _Kept, connection: int) -> bool:
        """Whether kept contents may answer a read (see :meth:`read_kept`)."""
        return (not kept.stale and kept.connection == connection and self._subscribed.get(uri) == connection
                and self._session.pool.clock() - kept.fetched_at < self._session.pool.catalogue_ttl_seconds)

    def _updated_since(self, seq: int, uri: str) -> bool:
        """Whether an update concerning ``uri`` came after update number ``seq`` (too many to
        tell: yes)."""
        if self._update_seq - seq >= _RECENT_UPDATES:
            return True
        return any(n > seq and _covers(uri, updated) for n, updated in self._recent_updates)

    def _keep_contents(self, uri: str, contents: tuple[ResourceContent, ...], connection: int) -> None:
        """Keep ``contents`` for ``uri``, within :data:`MAX_KEPT_BYTES` (least recently used out)."""
        self._forget(uri)
        size = sum(c.size_bytes for c in contents)
        if size > MAX_KEPT_BYTES:
            return
        self._kept[uri] = _Kept(contents=contents, size_bytes=size, fetched_at=self._session.pool.clock(),
                                connection=connection)
        self._kept_bytes += size
        while self._kept_bytes > MAX_KEPT_BYTES:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= dropped.size_bytes

    def _forget(self, uri: str) -> None:
        dropped = self._kept.pop(uri, None)
        if dropped is not None:
            self._kept_bytes -= dropped.size_bytes

    async def _drop_least_used(self) -> None:
        """Beyond :data:`MAX_KEPT_RESOURCES` subscriptions, drop the least recently used (its
        contents too): unsubscribed (2025-11-25) or left out of the next listen stream (2026-07-28)."""
        connection = self._session.connects
        while len(self._subscribed) > MAX_KEPT_RESOURCES:
            uri, on = self._subscribed.popitem(last=False)
            self._forget(uri)
            self._wanted.pop(uri, None)
            if on == connection and self._session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                await self._unsubscribe_legacy(uri)

    async def _subscribe_legacy(self, uri: str) -> bool:
        """2025-11-25: ``resources/subscribe`` for ``uri`` on the session; False when refused."""
        request = mcp_types.SubscribeRequest(params=mcp_types.SubscribeRequestParams(uri=uri))
        return await self._send_legacy(request, f"subscribe to the resource {uri!r}")

    async def _unsubscribe_legacy(self, uri: str) -> None:
        """2025-11-25: ``resources/unsubscribe`` for ``uri``; a failure is logged."""
        request = mcp_types.UnsubscribeRequest(params=mcp_types.UnsubscribeRequestParams(uri=uri))
        await self._send_legacy(request, f"unsubscribe from the resource {uri!r}")

    async def _send_legacy(self, request: Any, what: str) -> bool:
        """Send ``request`` (answered by an empty result) on the session; False, logged, when it
        failed (``what``: the request in words)."""
        config = self._session.config

        async def send(client: Client) -> None:
            with mcp_request_errors(config, what, config.list_timeout_seconds):
                await client.session.send_request(request, mcp_types.EmptyResult)

        try:
            await self._session.submit(send)
        except ToolError as exc:
            logger.info("MCP server %r: could not %s: %s", config.alias, what, exc.message)
            return False
        return True

    async def _listen_for(self, uris: list[str]) -> frozenset[str]:
        """2026-07-28: add ``uris`` to the resource listen stream (:meth:`listen_for_updates`
        opens it again) and wait for its acknowledgement, at most ``list_timeout_seconds``.

        Returns:
            The URIs the new stream honours (none when it failed or took too long).
        """
        for uri in uris:
            self._wanted[uri] = None
            self._wanted.move_to_end(uri)
        ack: asyncio.Future[frozenset[str]] = asyncio.get_running_loop().create_future()
        self._acks.append(ack)
        self._wanted_changed.set()
        try:
            return await asyncio.wait_for(asyncio.shield(ack), self._session.config.list_timeout_seconds)
        except TimeoutError:
            logger.info("MCP server %r: no acknowledgement of the resource subscriptions in time",
                        self._session.config.alias)
            return frozenset()

    async def listen_for_updates(self, client: Client, scope: anyio.CancelScope) -> None:
        """2026-07-28 connections whose server declares ``resources.subscribe`` (started by the
        pool with the connection, ended with ``scope``): a ``subscriptions/listen`` stream asking
        ``resourceSubscriptions`` for the URIs :meth:`keep` wants, opened again (after closing
        the last one) whenever URIs are added; its ``resources/updated`` events go to
        :meth:`mark_updated`. No replay: every new stream makes the kept contents stale. A stream
        refused or ended by the server honours nothing (reads go to the server) until URIs are
        added again."""
        with scope:
            while True:
                if not self._wanted_changed.is_set():
                    await self._wanted_changed.wait()
                self._wanted_changed.clear()
                acks, self._acks = self._acks, []
                if not self._wanted:
                    self._listening(frozenset(), acks)
                    continue
                try:
                    async with client.listen(resource_subscriptions=tuple(self._wanted)) as subscription:
                        self._listening(frozenset(subscription.honored.resource_subscriptions or ()), acks)
                        await self._consume(subscription)
                except Exception as exc:  # noqa: BLE001 - refused or lost: reads go to the server
                    logger.info("MCP server %r: resource subscription stream: %s", self._session.config.alias,
                                exc)
                    self._listening(frozenset(), acks)
                else:
                    if not self._wanted_changed.is_set():  # the server ended it
                        self._listening(frozenset(), [])

    def _listening(self, honoured: frozenset[str], acks: list[asyncio.Future[frozenset[str]]]) -> None:
        """A resource listen stream honouring ``honoured`` is open (or none: empty): kept
        contents are stale (no replay across streams); ``acks`` are answered."""
        connection = self._session.connects
        for kept in self._kept.values():
            kept.stale = True
        for uri in list(self._subscribed):
            if uri not in honoured:
                del self._subscribed[uri]
        for uri in honoured:
            self._subscribed.setdefault(uri, connection)
        for ack in acks:
            if not ack.done():
                ack.set_result(honoured)

    async def _consume(self, subscription: Any) -> None:
        """Route the stream's ``resources/updated`` events until it ends or URIs are added."""
        async with anyio.create_task_group() as tg:
            async def until_wanted_changes() -> None:
                await self._wanted_changed.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(until_wanted_changes)
            async for event in subscription:
                if isinstance(event, ResourceUpdated):
                    self.mark_updated(event.uri)
            tg.cancel_scope.cancel()
