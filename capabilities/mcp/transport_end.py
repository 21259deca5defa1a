"""Knowing that an MCP connection's transport has ended, through the SDK's public API only.

The mcp SDK keeps no public "closed" flag on its ``Client``: when a stdio server exits or a
connection drops while no call is in flight, the client stays entered and only the next
request finds out (``MCPError: Connection closed``). :func:`watched` wraps the transport
(the SDK's public :class:`mcp.client.Transport` protocol: an async context manager giving
``(read_stream, write_stream)``) so that the end of its read stream is recorded in a
:class:`TransportEnd` that the pool asks before handing out the connection.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import anyio


class TransportEnd:
    """Whether one connection's transport has ended (its read stream reached its end or was
    closed). One per connection: a reconnect gets a new one."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended = False
        """True once the server's side of the connection is gone (never reset)."""


class _WatchedReadStream:
    """A transport's read stream (the SDK's ``ReadStream`` protocol) that marks ``end`` when
    reading it finds its end: end of stream, or the stream closed under the reader."""

    def __init__(self, inner: Any, end: TransportEnd) -> None:
        self.inner = inner
        self.end = end

    @property
    def last_context(self) -> Any:
        """The inner stream's sender context, where it keeps one (the SDK reads it duck-typed)."""
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self.end.ended = True
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self.end.ended = True
            raise

    async def __aenter__(self) -> _WatchedReadStream:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self.inner.__aexit__(exc_type, exc, tb)


class _WatchedTransport:
    """The SDK's ``Transport`` protocol around another transport: the same streams, the read
    stream watched."""

    def __init__(self, inner: Any, end: TransportEnd) -> None:
        self.inner = inner
        self.end = end

    async def __aenter__(self) -> tuple[Any, Any]:
        read_stream, write_stream = await self.inner.__aenter__()
        return _WatchedReadStream(read_stream, self.end), write_stream

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self.inner.__aexit__(exc_type, exc, tb)


def watched(transport: Any, end: TransportEnd) -> Any:
    """``transport`` (an SDK transport: ``stdio_client(...)``, ``sse_client(...)``,
    ``streamable_http_client(...)``) with the end of its read stream recorded in ``end``."""
    return _WatchedTransport(transport, end)
