"""The HTTP client of a remote A2A agent: an ``httpx`` client (the a2a-sdk's) whose every TCP
connect is resolved and checked by the platform's outbound address rules
(:func:`llm.netrules.resolve_outbound`: loopback, private, link-local and metadata addresses
refused unless an operator listed the host in ``OUTBOUND_ALLOWED_HOSTS`` or its range in
``OUTBOUND_ALLOWED_CIDRS``), as for remote MCP servers and model providers. The name is resolved
once per connect and only the checked addresses are dialled (no DNS-rebinding window); the
socket's peer is checked again. Redirects are not followed; no proxies from the environment.

The MCP and provider clients use ``httpx2`` (:func:`capabilities.netsafe.outbound_transport`);
the a2a-sdk takes an ``httpx`` client, hence this ``httpcore`` backend with the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpcore
import httpx

from llm.netrules import (
    METADATA_ADDRESSES,
    FetchError,
    address_block_reason,
    outbound_allowed_networks,
    outbound_host_allowed,
    peer_ip,
    resolve_outbound,
)


class OutboundHttpcoreBackend(httpcore.AsyncNetworkBackend):
    """An ``httpcore`` network backend applying :func:`llm.netrules.resolve_outbound` at every
    connect (the ``httpcore`` twin of :class:`llm.netrules.OutboundBackend`). Unix sockets are
    refused."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        """Connect to the first checked address of ``host`` that answers.

        Raises:
            httpcore.ConnectError: a refused address (the rules' message), or no address answered.
        """
        try:
            addresses = await resolve_outbound(host, port)
        except FetchError as exc:
            raise httpcore.ConnectError(exc.message) from exc
        listed = outbound_host_allowed(host, port)
        last: Exception | None = None
        for ip in addresses:
            try:
                stream = await self._inner.connect_tcp(str(ip), port, timeout=timeout, local_address=local_address,
                                                       socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as exc:
                last = exc
                continue
            peer = peer_ip(stream)
            if peer is None or peer != ip or peer in METADATA_ADDRESSES or (
                    not listed and address_block_reason(peer, allowed=outbound_allowed_networks())):
                await stream.aclose()
                raise httpcore.ConnectError(f"connected to unexpected address {peer}")
            return stream
        if isinstance(last, httpcore.ConnectTimeout):
            raise last
        raise httpcore.ConnectError(str(last) if last else "no address to connect to")

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def __aiter__(self):  # noqa: ANN204
        try:
            async for part in self.stream:
                yield part
        except httpcore.ReadTimeout as exc:
            raise httpx.ReadTimeout(str(exc)) from exc
        except httpcore.ReadError as exc:
            raise httpx.ReadError(str(exc)) from exc

    async def aclose(self) -> None:
        if hasattr(self.stream, "aclose"):
            await self.stream.aclose()


_ERRORS: tuple[tuple[type[Exception], type[Exception]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout), (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadTimeout, httpx.ReadTimeout), (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout), (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError), (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError), (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
)


class OutboundTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` transport over an ``httpcore`` pool with :class:`OutboundHttpcoreBackend`
    (httpx's own transport takes no network backend); httpcore's errors raised as httpx's."""

    def __init__(self) -> None:
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), max_connections=10, max_keepalive_connections=5,
            http1=True, http2=False, network_backend=OutboundHttpcoreBackend())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the streamed response."""
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        try:
            response = await self.pool.handle_async_request(core_request)
        except Exception as exc:
            for source, target in _ERRORS:
                if isinstance(exc, source):
                    raise target(str(exc)) from exc
            raise
        return httpx.Response(status_code=response.status, headers=response.headers, stream=_Body(response.stream),
                              extensions=response.extensions)

    async def aclose(self) -> None:
        """Close the pool."""
        await self.pool.aclose()


def checked_client(headers: Mapping[str, str], timeout_seconds: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for a remote A2A agent: ``headers`` on every request (its
    credentials), ``timeout_seconds`` per operation (connect, read, write), every connect
    address-checked (module docstring), no redirects, no proxies from the environment."""
    return httpx.AsyncClient(headers=dict(headers), timeout=httpx.Timeout(timeout_seconds), trust_env=False,
                             follow_redirects=False, transport=OutboundTransport())
