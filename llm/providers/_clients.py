"""A per-event-loop cache of SDK clients, shared by the provider adapters.

SDK clients own an HTTP connection pool bound to the event loop that created them, so each
loop gets its own cache, keyed by what makes a client distinct (base URL, key, timeouts).
Clients are closed by :meth:`LoopClientCache.aclose` or, automatically, when the loop shuts
down its async generators (``asyncio.run``, pytest-asyncio): a suspended async generator per
loop carries the closing ``finally``. Caches of loops closed without that are dropped; their
sockets close when the clients are garbage-collected (the adapters build their clients with
the SDKs' ``DefaultAsyncHttpxClient``, which has no finaliser that would touch another loop).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar


class _Closable(Protocol):
    async def close(self) -> Any: ...


C = TypeVar("C", bound=_Closable)


@dataclass(slots=True)
class _LoopClients(Generic[C]):
    loop: asyncio.AbstractEventLoop
    clients: OrderedDict[Hashable, C] = field(default_factory=OrderedDict)
    closer: AsyncGenerator[None, None] | None = None
    abandoned: bool = False
    """The loop closed without shutting down its async generators: nothing can be awaited."""


class LoopClientCache(Generic[C]):
    """Clients made by ``create(key)``, cached per running event loop, at most ``max_per_loop``
    per loop (least recently used dropped first: not closed, a stream may still use it)."""

    def __init__(self, create: Callable[[Any], C], *, max_per_loop: int = 64) -> None:
        self._create = create
        self._max = max_per_loop
        self._by_loop: dict[int, _LoopClients[C]] = {}

    def get(self, key: Hashable) -> C:
        """The client for ``key`` in the running loop (created on first use)."""
        slot = self._slot(asyncio.get_running_loop())
        client = slot.clients.get(key)
        if client is not None:
            slot.clients.move_to_end(key)
            return client
        client = slot.clients[key] = self._create(key)
        while len(slot.clients) > self._max:
            slot.clients.popitem(last=False)
        return client

    async def aclose(self) -> None:
        """Close every client of the running loop; streams still open on them fail."""
        loop = asyncio.get_running_loop()
        slot = self._by_loop.get(id(loop))
        if slot is None or slot.loop is not loop:
            return
        if slot.closer is not None:
            await slot.closer.aclose()  # runs _close_at_loop_shutdown's finally
        else:  # pragma: no cover - the closer always starts
            del self._by_loop[id(loop)]
            for client in slot.clients.values():
                await client.close()

    async def _close_at_loop_shutdown(self, slot: _LoopClients[C]) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if self._by_loop.get(id(slot.loop)) is slot:
                del self._by_loop[id(slot.loop)]
            clients = list(slot.clients.values())
            slot.clients.clear()
            if not slot.abandoned:
                for client in clients:
                    await client.close()

    @staticmethod
    def _abandon(slot: _LoopClients[C]) -> None:
        slot.abandoned = True
        slot.clients.clear()
        if slot.closer is not None:
            try:
                slot.closer.aclose().send(None)
            except StopIteration:
                pass
            slot.closer = None

    def _slot(self, loop: asyncio.AbstractEventLoop) -> _LoopClients[C]:
        slot = self._by_loop.get(id(loop))
        if slot is not None and slot.loop is loop:
            return slot
        for key in [k for k, v in self._by_loop.items() if v.loop.is_closed()]:
            self._abandon(self._by_loop.pop(key))
        slot = self._by_loop[id(loop)] = _LoopClients(loop)
        # Run the closer up to its ``yield`` now, synchronously: the loop's async-generator
        # hooks register it, and ``loop.shutdown_asyncgens()`` will run its ``finally``.
        closer = self._close_at_loop_shutdown(slot)
        try:
            closer.asend(None).send(None)
        except StopIteration:
            slot.closer = closer
        return slot


# --- Outbound address rules -------------------------------------------------------------------

SDK_CONNECTION_LIMITS: dict[str, int] = {"max_connections": 1000, "max_keepalive_connections": 100}
"""The openai/anthropic SDKs' own default pool limits (``DEFAULT_CONNECTION_LIMITS``)."""


def checked_httpx_transport(*, verify: Any = True) -> Any:
    """An ``httpx2`` transport for a provider's SDK client whose every TCP connect resolves the
    host once, checks each address against the outbound rules
    (:func:`llm.netrules.resolve_outbound`: no loopback, private, link-local or metadata
    address unless an operator allowed it) and connects only to checked addresses.

    Pass it as ``transport=`` to ``openai.DefaultAsyncHttpxClient`` /
    ``anthropic.DefaultAsyncHttpxClient``. A refused address fails the call as a connection
    error (``network``) whose message says why.
    """
    import httpx2

    from llm.netrules import outbound_transport

    return outbound_transport(verify=verify, limits=httpx2.Limits(**SDK_CONNECTION_LIMITS))


def checked_aiohttp_transport(*, verify: Any) -> Any:
    """An ``httpx2`` transport over ``aiohttp`` (:class:`llm.providers.aiohttp_transport.AiohttpTransport`,
    public APIs only) whose session's connector applies the outbound rules: the resolver
    (:class:`llm.netrules.OutboundResolver`) checks every name it resolves and the socket
    factory every address aiohttp connects to. Pass it as ``transport=`` to
    ``openai.DefaultAioHttpClient``. Pool limits: the SDKs' (:data:`SDK_CONNECTION_LIMITS`).
    """
    import aiohttp
    import httpx2

    from llm.netrules import outbound_resolver
    from llm.providers.aiohttp_transport import AiohttpTransport, tls_context

    limits = httpx2.Limits(**SDK_CONNECTION_LIMITS)
    ssl_context = tls_context(verify)

    def session() -> aiohttp.ClientSession:
        resolver = outbound_resolver()
        connector = aiohttp.TCPConnector(
            resolver=resolver, socket_factory=resolver.socket_factory,  # names, then every address
            ssl=ssl_context, limit=limits.max_connections or 0, keepalive_timeout=limits.keepalive_expiry,
        )
        return aiohttp.ClientSession(connector=connector)

    return AiohttpTransport(session=session)
