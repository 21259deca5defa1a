"""SSRF-safe outbound HTTP for tools that fetch URLs the model chose (``web_fetch``, ``web_read``).

The model (or a web page it read) picks the URL, so every request is treated as hostile:

* Only ``http``/``https``, no credentials in the URL, any port.
* The host is resolved **once per hop** by :func:`resolve_host`; every resolved address must be
  public (:func:`address_block_reason`), else the hop is refused. The connection then goes to
  one of those validated IPs: :class:`PinnedBackend` (an httpcore network backend) substitutes
  the validated IP for the hostname at ``connect_tcp`` and refuses any host it was not given,
  so there is no second DNS lookup and no DNS-rebinding window. The URL, the ``Host`` header
  and TLS SNI/certificate checks keep the hostname. After connecting, the peer address of the
  socket is checked again.
* Redirects are followed here, not by httpx, at most :data:`MAX_REDIRECTS`, and each hop is
  resolved and validated like the first.
* The body is read as a stream and cut at ``max_bytes`` (decoded bytes; gzip/deflate are
  decompressed here with a bounded output, so a compression bomb costs at most ``max_bytes``).
* A connect timeout (default 5 s) and a total deadline (default 20 s) over all hops, DNS
  included. No proxies from the environment, no cookie jar outliving the call (a fresh client
  per :func:`safe_fetch`).

Blocked addresses (refused unless listed in ``settings.WEB_FETCH_ALLOWED_CIDRS``, which is
empty by default and exists so tests can reach their own servers on 127.0.0.1): everything
Python's ``ipaddress`` does not call global (RFC 6890 special-purpose registries: loopback,
RFC 1918 private, link-local 169.254/16 and fe80::/10, CGNAT 100.64/10 (RFC 6598), ULA
fc00::/7, documentation, benchmarking, 0/8, 240/4 …), plus multicast, unspecified, reserved,
IPv4 embedded in IPv6 (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible, 6to4 2002::/16, NAT64
64:ff9b::/96, Teredo 2001::/32) judged by the embedded IPv4, and cloud metadata endpoints
(169.254.169.254, 169.254.170.2, 100.100.100.200, fd00:ec2::254 …, and metadata host names),
which stay blocked even if an allowed CIDR covers them.

The address rules themselves (:func:`address_block_reason`, :func:`resolve_host`,
:func:`validate_url`, the outbound checks for providers and MCP servers) live in
:mod:`llm.netrules`, below this package, and are re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import ssl
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx
from django.conf import settings

from llm.netrules import (  # the address rules, shared with the model layer (re-exported)
    MAX_URL_LENGTH,
    METADATA_ADDRESSES,
    METADATA_HOSTNAMES,
    FetchError,
    IPAddress,
    OutboundBackend,
    OutboundResolver,
    address_block_reason,
    check_outbound_url,
    outbound_allowed_networks,
    outbound_backend,
    outbound_host_allowed,
    outbound_resolver,
    outbound_transport,
    peer_ip,
    resolve_host,
    resolve_outbound,
    validate_url,
)

DEFAULT_MAX_BYTES = 1_000_000
"""Default body cap: 1 MB (decoded bytes)."""
HARD_MAX_BYTES = 5_000_000
"""No caller may ask for more than 5 MB."""
CONNECT_TIMEOUT_SECONDS = 5.0
TOTAL_TIMEOUT_SECONDS = 20.0
"""Deadline for the whole fetch: every hop's DNS, connect, request and body."""
MAX_REDIRECTS = 5
USER_AGENT = "AgentPlatform-web_fetch/0.1"

@dataclass(slots=True)
class FetchResult:
    """The outcome of :func:`safe_fetch` (any HTTP status; the caller decides what is an error)."""

    status_code: int
    reason: str
    url: str
    """The final URL, after redirects."""
    content_type: str
    """The ``Content-Type`` header as sent ('' when missing)."""
    body: bytes
    """Decoded (decompressed) body, at most ``max_bytes``."""
    truncated: bool
    """True when the body was longer than ``max_bytes`` and was cut."""
    redirects: list[str] = field(default_factory=list)
    """URLs redirected from, in order."""
    peer_address: str = ""
    """The IP address the final response came from."""
    charset: str | None = None
    """The charset named in ``Content-Type``, if any."""

    @property
    def mime_type(self) -> str:
        return self.content_type.split(";", 1)[0].strip().lower()


# ------------------------------------------------------------------------------------------ transport

class PinnedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to addresses validated beforehand.

    ``pins`` maps a host name (as httpcore passes it: ASCII, lower case, IPv6 without
    brackets) to its validated addresses. ``connect_tcp`` dials those IPs (the first that
    answers) instead of resolving the name again, refuses hosts without a pin, and re-checks
    the socket's peer address. TLS is started by httpcore afterwards with the host name as SNI.
    """

    def __init__(self) -> None:
        self.pins: dict[str, list[IPAddress]] = {}
        self.connected: list[str] = []
        """Peer addresses actually connected to, in order (for the result and for tests)."""
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        addresses = self.pins.get(host.lower())
        if not addresses:
            raise httpcore.ConnectError(f"host {host!r} was not validated")
        last: Exception | None = None
        for ip in addresses:
            try:
                stream = await self._inner.connect_tcp(str(ip), port, timeout=timeout, local_address=local_address,
                                                       socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as exc:
                last = exc
                continue
            peer = peer_ip(stream)
            if peer is None or peer != ip or address_block_reason(peer):
                await stream.aclose()
                raise httpcore.ConnectError(f"connected to unexpected address {peer}")
            self.connected.append(str(peer))
            return stream
        if isinstance(last, httpcore.ConnectTimeout):
            raise last
        raise httpcore.ConnectError(str(last) if last else "no address to connect to")

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise httpcore.ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying TLS context (certifi's CA bundle), built once: loading it costs ~20 ms."""
    return httpx.create_ssl_context(trust_env=False)


_HTTPCORE_TO_HTTPX: tuple[tuple[type[Exception], type[Exception]], ...] = (
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
)
"""httpcore's errors and the httpx errors they become (as httpx's own transport maps them)."""


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    """Re-raise an httpcore error as the most specific matching httpx error; others unchanged."""
    try:
        yield
    except Exception as exc:
        target: type[Exception] | None = None
        for source, candidate in _HTTPCORE_TO_HTTPX:
            if isinstance(exc, source) and (target is None or issubclass(candidate, target)):
                target = candidate
        if target is None:
            raise
        raise target(str(exc)) from exc


class _PinnedBody(httpx.AsyncByteStream):
    """A response body of :class:`_PinnedTransport`: httpcore's stream, errors mapped to httpx's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors():
            async for part in self.stream:
                yield part

    async def aclose(self) -> None:
        if hasattr(self.stream, "aclose"):
            await self.stream.aclose()


class _PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport of ours over httpcore's public ``AsyncConnectionPool`` with a
    :class:`PinnedBackend` (httpx's own ``AsyncHTTPTransport`` takes no network backend).

    Requests, responses and errors are mapped as httpx's own transport maps them; no retries,
    no proxies, no keep-alive (one fetch, then closed).
    """

    def __init__(self, backend: PinnedBackend) -> None:
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=_ssl_context(),
            max_connections=4, max_keepalive_connections=0, http1=True, http2=False,
            network_backend=backend,
        )
        """The httpcore pool whose every connect goes through ``backend``."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on the pool; the streamed response (httpcore errors as httpx's)."""
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions,
        )
        with _httpx_errors():
            response = await self.pool.handle_async_request(core_request)
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_PinnedBody(response.stream), extensions=response.extensions)

    async def aclose(self) -> None:
        """Close the pool and its connections."""
        await self.pool.aclose()


# ------------------------------------------------------------------------------------------ fetch

async def safe_fetch(url: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                     connect_timeout_seconds: float | None = None, total_timeout_seconds: float | None = None,
                     accept: str = "*/*") -> FetchResult:
    """GET ``url`` safely (see the module docstring), following up to 5 redirects.

    Args:
        url: An http(s) URL.
        max_bytes: Body cap in bytes, 1 … 5,000,000; a longer body is cut (``truncated``).
        connect_timeout_seconds: Per TCP connect; default ``settings.WEB_FETCH_CONNECT_TIMEOUT_SECONDS`` (5).
        total_timeout_seconds: For everything; default ``settings.WEB_FETCH_TOTAL_TIMEOUT_SECONDS`` (20).
        accept: The ``Accept`` header.

    Returns:
        A :class:`FetchResult` for the final response, whatever its status.

    Raises:
        FetchError: ``invalid_url``, ``invalid_arguments`` (``max_bytes``), ``blocked_address``
            (any hop), ``timeout``, or ``http_error`` (DNS, connection, TLS, protocol failure,
            too many redirects, an unsupported or corrupt Content-Encoding).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= HARD_MAX_BYTES:
        raise FetchError(f"`max_bytes` must be an integer from 1 to {HARD_MAX_BYTES}.", code="invalid_arguments")
    connect_timeout = connect_timeout_seconds or getattr(settings, "WEB_FETCH_CONNECT_TIMEOUT_SECONDS",
                                                         CONNECT_TIMEOUT_SECONDS)
    total_timeout = total_timeout_seconds or getattr(settings, "WEB_FETCH_TOTAL_TIMEOUT_SECONDS", TOTAL_TIMEOUT_SECONDS)
    current = validate_url(url)
    try:
        async with asyncio.timeout(total_timeout):
            return await _fetch_hops(current, max_bytes=max_bytes, connect_timeout=connect_timeout,
                                     total_timeout=total_timeout, accept=accept)
    except TimeoutError as exc:
        raise FetchError(f"Fetching {str(current)!r} took longer than {total_timeout:g} s.", code="timeout") from exc


async def _fetch_hops(current: httpx.URL, *, max_bytes: int, connect_timeout: float, total_timeout: float,
                      accept: str) -> FetchResult:
    backend = PinnedBackend()
    redirects: list[str] = []
    timeout = httpx.Timeout(total_timeout, connect=connect_timeout)
    headers = {"User-Agent": USER_AGENT, "Accept": accept, "Accept-Encoding": "gzip, deflate"}
    async with httpx.AsyncClient(transport=_PinnedTransport(backend), timeout=timeout, follow_redirects=False,
                                 trust_env=False, headers=headers) as client:
        while True:
            host = current.raw_host.decode("ascii").lower()
            port = current.port or (443 if current.scheme == "https" else 80)
            backend.pins[host] = await resolve_host(host, port)
            try:
                async with client.stream("GET", current) as response:
                    if response.is_redirect and "location" in response.headers:
                        location = response.headers["location"]
                        if len(redirects) >= MAX_REDIRECTS:
                            raise FetchError(f"More than {MAX_REDIRECTS} redirects (last to {location!r}).",
                                             code="http_error")
                        redirects.append(str(current))
                        try:
                            target = current.join(location)
                        except (httpx.InvalidURL, ValueError) as exc:
                            raise FetchError(f"Redirect to an invalid URL {location!r}.", code="http_error") from exc
                        current = validate_url(str(target))
                        client.cookies.clear()  # cookies never cross a hop
                        continue
                    body, truncated = await _read_capped(response, max_bytes)
                    return FetchResult(
                        status_code=response.status_code, reason=response.reason_phrase, url=str(current),
                        content_type=response.headers.get("content-type", ""), body=body, truncated=truncated,
                        redirects=redirects, peer_address=backend.connected[-1] if backend.connected else "",
                        charset=response.charset_encoding,
                    )
            except httpx.TimeoutException as exc:
                raise FetchError(f"Fetching {str(current)!r} timed out ({type(exc).__name__}).", code="timeout") from exc
            except httpx.HTTPError as exc:
                raise FetchError(f"Fetching {str(current)!r} failed: {type(exc).__name__}: {exc}.",
                                 code="http_error") from exc


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """Read the raw stream, decompressing gzip/deflate with a bounded output."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        decoder = None
    elif encoding in ("gzip", "x-gzip"):
        decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
    elif encoding == "deflate":
        decoder = _DeflateDecoder()
    else:
        raise FetchError(f"The server sent an unsupported Content-Encoding {encoding!r}.", code="http_error")
    out = bytearray()
    try:
        async for chunk in response.aiter_raw():
            if decoder is None:
                out += chunk
            else:
                out += decoder.decompress(chunk, max_bytes + 1 - len(out))
            if len(out) > max_bytes:
                return bytes(out[:max_bytes]), True
    except zlib.error as exc:
        raise FetchError(f"The response body is corrupt ({encoding}: {exc}).", code="http_error") from exc
    return bytes(out), False


class _DeflateDecoder:
    """``Content-Encoding: deflate`` is zlib-wrapped per RFC 9110 but often raw; accept both."""

    def __init__(self) -> None:
        self._obj = zlib.decompressobj()
        self._first = True

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if self._first:
            self._first = False
            try:
                return self._obj.decompress(data, max_length)
            except zlib.error:
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._obj.decompress(data, max_length)


def decode_text(result: FetchResult) -> str:
    """The body as text: the ``Content-Type`` charset, else an HTML ``<meta charset>``, else
    UTF-8, else Windows-1252 (never raises; undecodable bytes become U+FFFD)."""
    candidates = [result.charset, _meta_charset(result.body) if "html" in result.mime_type else None, "utf-8"]
    for charset in candidates:
        if not charset:
            continue
        try:
            return result.body.decode(charset, errors="strict")
        except (LookupError, UnicodeDecodeError):
            if result.truncated and charset:
                try:  # the cut may have split a multi-byte character at the very end
                    return result.body[:-4].decode(charset, errors="strict") + result.body[-4:].decode(
                        charset, errors="ignore")
                except (LookupError, UnicodeDecodeError):
                    pass
    return result.body.decode("cp1252", errors="replace")


def _meta_charset(body: bytes) -> str | None:
    match = re.search(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", body[:4096], re.I)
    return match.group(1).decode("ascii") if match else None


TEXT_MIME_TYPES = ("application/json", "application/xml", "application/javascript", "application/xhtml+xml",
                   "application/x-ndjson", "application/yaml", "application/x-yaml", "application/rss+xml",
                   "application/atom+xml", "image/svg+xml")


def is_text(mime_type: str) -> bool:
    """True for MIME types whose bodies are text (``text/*``, JSON, XML, …, ``+json``/``+xml``)."""
    return (mime_type.startswith("text/") or mime_type in TEXT_MIME_TYPES
            or mime_type.endswith(("+json", "+xml")))


__all__ = [
    # the address rules (llm.netrules), re-exported for the capabilities
    "IPAddress", "MAX_URL_LENGTH", "METADATA_ADDRESSES", "METADATA_HOSTNAMES", "FetchError", "OutboundBackend",
    "OutboundResolver", "address_block_reason", "check_outbound_url", "outbound_allowed_networks",
    "outbound_backend", "outbound_host_allowed", "outbound_resolver", "outbound_transport", "resolve_host",
    "resolve_outbound", "validate_url",
    # the SSRF-safe fetch for tools
    "CONNECT_TIMEOUT_SECONDS", "DEFAULT_MAX_BYTES", "HARD_MAX_BYTES", "MAX_REDIRECTS", "TEXT_MIME_TYPES",
    "TOTAL_TIMEOUT_SECONDS", "USER_AGENT", "FetchResult", "PinnedBackend", "decode_text", "is_text", "safe_fetch",
]
