"""An ``httpx2`` transport over ``aiohttp``, built from the two libraries' public APIs only.

The openai SDK's ``DefaultAioHttpClient`` runs on a vendored copy of httpx-aiohttp
(``openai._vendor``, private), whose transport builds its own ``aiohttp.TCPConnector`` and
has no parameter for a resolver. This transport does what it does (same request mapping,
same error mapping) over an ``aiohttp.ClientSession`` made by a factory of ours, so the
caller chooses the connector: :func:`llm.providers._clients.checked_aiohttp_transport` gives
it a ``TCPConnector(resolver=..., socket_factory=...)`` that applies the outbound address
rules (:mod:`llm.netrules`) at every connect. Pass it as ``transport=`` to
``openai.DefaultAioHttpClient`` (public: that parameter is honoured as given).

A response made here carries aiohttp's body reader under the response extension
:data:`READER_EXTENSION` (:func:`aiohttp_reader`), so the SSE parser can read the socket
buffer directly instead of through httpx2's stream layers.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

import aiohttp
import httpx2

READER_EXTENSION: Final[str] = "agent_platform.aiohttp_reader"
"""Response extension holding the ``aiohttp.StreamReader`` of a response made here."""

CHUNK_BYTES: Final[int] = 16 * 1024
"""Largest chunk :class:`AiohttpBody` yields through httpx2's ``aiter_bytes``."""

# aiohttp error → httpx2 error; the most specific match wins (as httpx-aiohttp maps them, so
# ``LLM_HTTP_TRANSPORT=aiohttp`` classifies failures as it did on the SDK's transport).
ERROR_MAP: Final[tuple[tuple[type[BaseException], type[httpx2.TransportError]], ...]] = (
    (aiohttp.ServerTimeoutError, httpx2.TimeoutException),
    (aiohttp.SocketTimeoutError, httpx2.ReadTimeout),
    (aiohttp.ClientConnectionError, httpx2.ConnectTimeout),
    (aiohttp.ClientConnectorError, httpx2.ConnectError),
    (aiohttp.ClientPayloadError, httpx2.ReadError),
    (aiohttp.ClientProxyConnectionError, httpx2.ProxyError),
    (aiohttp.ClientHttpProxyError, httpx2.ProxyError),
    (aiohttp.NonHttpUrlClientError, httpx2.UnsupportedProtocol),
    (aiohttp.InvalidUrlClientError, httpx2.UnsupportedProtocol),
)


def mapped_error(exc: BaseException) -> httpx2.TransportError | None:
    """``exc`` as the httpx2 transport error it maps to (message kept, ``exc`` as cause), or
    None when it is not an aiohttp failure in :data:`ERROR_MAP`."""
    if isinstance(exc, httpx2.TransportError):
        return exc
    target: type[httpx2.TransportError] | None = None
    for source, candidate in ERROR_MAP:
        if isinstance(exc, source) and (target is None or issubclass(candidate, target)):
            target = candidate
    if target is None:
        return None
    mapped = target(str(exc))
    mapped.__cause__ = exc
    return mapped


@contextlib.contextmanager
def map_aiohttp_errors() -> Iterator[None]:
    """Re-raise aiohttp failures as httpx2 transport errors (:func:`mapped_error`); other
    exceptions pass unchanged."""
    try:
        yield
    except Exception as exc:
        mapped = mapped_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc


def aiohttp_reader(response: httpx2.Response) -> aiohttp.StreamReader | None:
    """The aiohttp body reader of a response made by :class:`AiohttpTransport`, else None."""
    return response.extensions.get(READER_EXTENSION)


class AiohttpBody(httpx2.AsyncByteStream):
    """The body of one aiohttp response as an httpx2 byte stream; closing it releases the
    connection to aiohttp's pool."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with map_aiohttp_errors():
            async for chunk in self.response.content.iter_chunked(CHUNK_BYTES):
                yield chunk

    async def aclose(self) -> None:
        with map_aiohttp_errors():
            self.response.release()
            await self.response.wait_for_close()


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2.AsyncBaseTransport`` sending requests on an ``aiohttp.ClientSession``.

    Args:
        session: Makes the session on first use (inside the running event loop, as aiohttp
            requires); it owns the connector, so the caller decides how hosts are resolved
            and sockets are made.

    Timeouts come from the request's ``timeout`` extension (httpx2's): ``connect`` →
    aiohttp's ``sock_connect``, ``read`` → ``sock_read``, ``pool`` → ``connect``. Redirects,
    decompression and retries are left to httpx2 / the caller. Errors: httpx2 transport
    errors (:data:`ERROR_MAP`).
    """

    def __init__(self, *, session: Callable[[], aiohttp.ClientSession]) -> None:
        self._make_session = session
        self._session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request``; the response with its body still to read (streamed)."""
        if self._session is None:
            self._session = self._make_session()
        timeout = request.extensions.get("timeout", {})
        data: Any
        try:
            data = request.content or None
        except httpx2.RequestNotRead:
            data = request.stream  # a streamed upload: aiohttp frames it itself
            request.headers.pop("transfer-encoding", None)
        with map_aiohttp_errors():
            response = await self._session.request(
                request.method, str(request.url), headers=request.headers, data=data,
                allow_redirects=False, auto_decompress=False, compress=False,
                timeout=aiohttp.ClientTimeout(
                    sock_connect=timeout.get("connect"), sock_read=timeout.get("read"), connect=timeout.get("pool"),
                ),
                server_hostname=request.extensions.get("sni_hostname"),
            )
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1", READER_EXTENSION: response.content}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx2.Response(
            status_code=response.status, headers=response.raw_headers, stream=AiohttpBody(response),
            request=request, extensions=extensions,
        )

    async def aclose(self) -> None:
        """Close the session (and its connections) if one was made."""
        if self._session is not None:
            await self._session.close()


def tls_context(verify: Any) -> ssl.SSLContext:
    """``verify`` as an ``ssl.SSLContext`` (a context as is; else httpx2's, built from it)."""
    return verify if isinstance(verify, ssl.SSLContext) else httpx2.create_ssl_context(verify=verify)


__all__ = [
    "CHUNK_BYTES", "ERROR_MAP", "READER_EXTENSION", "AiohttpBody", "AiohttpTransport", "aiohttp_reader",
    "map_aiohttp_errors", "mapped_error", "tls_context",
]
