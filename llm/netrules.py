"""Outbound address rules: which addresses the platform may connect to, checked at every connect.

The model layer needs them (provider base URLs are typed by tenant admins: checked when saved
and at every TCP connect of a provider stream), and so do the capabilities (``web_fetch``'s
pinned connections, remote MCP servers, the sandbox egress proxy), which sit above ``llm``
in the layer order (tenants → llm → capabilities → agents → sessions). So the rules live
here, and :mod:`capabilities.netsafe` (the SSRF-safe fetch for tools) builds on them.

* :func:`address_block_reason`: why an address is not public (loopback, RFC 1918 private,
  link-local, CGNAT, ULA, documentation, reserved, IPv4 embedded in IPv6 judged by the
  embedded address, …) and cloud metadata addresses (:data:`METADATA_ADDRESSES`, blocked
  even when an allowed network covers them).
* :func:`resolve_host`: one DNS lookup (:func:`_getaddrinfo`, the seam tests patch to
  simulate rebinding resolvers), every address checked; metadata host names
  (:data:`METADATA_HOSTNAMES`) and ``localhost`` refused before any lookup.
* Platform connections on a tenant's behalf: :func:`resolve_outbound` (the rules above with
  ``OUTBOUND_ALLOWED_CIDRS``; ``OUTBOUND_ALLOWED_HOSTS`` lets listed ``host:port`` through),
  :func:`check_outbound_url` (at save), :func:`outbound_transport` (httpx2, for the SDKs and
  MCP) and :func:`outbound_resolver` (aiohttp), which resolve once, check every address and
  connect only to the checked ones (no DNS-rebinding window).

Errors are :class:`FetchError` (``code``: ``invalid_url``, ``blocked_address``,
``http_error``, …; the message is written for a reader such as the model or an admin).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx
from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 4096
"""Longest URL accepted by :func:`validate_url`, characters."""

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle (v1)…
    "169.254.170.2",  # AWS ECS task metadata
    "169.254.169.123",  # AWS time sync
    "169.254.169.253",  # AWS VPC DNS
    "168.63.129.16",  # Azure wire server (a public address!)
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud
    "fd00:ec2::254",  # AWS IMDS over IPv6
    "fd00:ec2::23",  # AWS DNS over IPv6
    "fd20:ce::254",  # GCP IMDS over IPv6
))
"""Cloud instance-metadata addresses: blocked always, even when an allowed CIDR covers them."""

METADATA_HOSTNAMES: frozenset[str] = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.internal",
    "instance-data", "instance-data.ec2.internal", "metadata.tencentyun.com", "metadata.platformequinix.com",
})
"""Host names of metadata services (refused before any DNS lookup)."""

HOST_NAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})?(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})?)*\.?")
"""A DNS name: dot-separated labels of letters, digits, '-' and '_' (punycode for IDNs)."""
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class FetchError(Exception):
    """A fetch failed; ``code`` is one of ``invalid_url``, ``invalid_arguments``, ``blocked_address``,
    ``timeout``, ``http_error``. The message is written for the model."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code



# ------------------------------------------------------------------------------------------ addresses

def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(c, strict=False) for c in getattr(settings, "WEB_FETCH_ALLOWED_CIDRS", ()) or ()]


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's (obfuscation undone by ipaddress)
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_block_reason(ip: IPAddress, *, allowed: Iterable[Any] | None = None) -> str | None:
    """Why ``ip`` may not be fetched from, or None if it may.

    Args:
        ip: An IPv4 or IPv6 address (a scope id, as in ``fe80::1%eth0``, is ignored).
        allowed: Networks that are allowed although not public; defaults to
            ``settings.WEB_FETCH_ALLOWED_CIDRS`` (empty in production). Metadata addresses stay
            blocked regardless.

    Returns:
        A short reason ("loopback", "private", "link-local", "cloud metadata", …) or None.
    """
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    if ip in METADATA_ADDRESSES:
        return "cloud metadata"
    networks = _allowed_networks() if allowed is None else list(allowed)
    if any(ip.version == n.version and ip in n for n in networks):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            inner = address_block_reason(embedded, allowed=networks)
            return f"IPv4-embedded {inner}" if inner else None
    checks = (
        ("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast), ("reserved", ip.is_reserved),
        ("shared address space (CGNAT)", ip.version == 4 and ip in ipaddress.IPv4Network("100.64.0.0/10")),
        ("unique local (ULA)", ip.version == 6 and ip in ipaddress.IPv6Network("fc00::/7")),
        ("site-local", ip.version == 6 and ip.is_site_local),
        ("private", ip.is_private),
        ("not globally routable", not ip.is_global),
    )
    for reason, hit in checks:
        if hit:
            return reason
    return None


async def _getaddrinfo(host: str, port: int) -> list[tuple[Any, ...]]:
    """The one DNS lookup (patched in tests to simulate rebinding resolvers)."""
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)


async def resolve_host(host: str, port: int, *, allowed: Iterable[Any] | None = None) -> list[IPAddress]:
    """Resolve ``host`` once and return its validated addresses (IPv4 first, order kept).

    ``allowed``: networks allowed although not public (default: ``WEB_FETCH_ALLOWED_CIDRS``;
    :func:`resolve_outbound` passes ``OUTBOUND_ALLOWED_CIDRS``).

    Raises:
        FetchError(code="blocked_address"): The name is a metadata host name, or ANY resolved
            address is blocked (a name with one private address among public ones is refused
            as a whole: an attacker could otherwise race the choice).
        FetchError(code="http_error"): The name does not resolve.
    """
    name = host.rstrip(".").lower()
    if name in METADATA_HOSTNAMES:
        raise FetchError(f"Refused: {host!r} is a cloud metadata service.", code="blocked_address")
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
        raise FetchError(f"Refused: {host!r} is a loopback name.", code="blocked_address")
    literal = ip_literal(name)
    addresses = await lookup_addresses(host, port)
    for ip in addresses:
        reason = address_block_reason(ip, allowed=allowed)
        if reason:
            shown = host if literal is not None else f"{host!r} (resolves to {ip})"
            raise FetchError(
                f"Refused: {shown} is a {reason} address. Only public internet addresses can be fetched.",
                code="blocked_address",
            )
    return sorted(addresses, key=lambda a: a.version)


async def lookup_addresses(host: str, port: int) -> list[IPAddress]:
    """``host``'s addresses (an IP literal, brackets allowed, is its own), unchecked, in the
    resolver's order without duplicates: the one DNS lookup the address rules build on.

    Raises:
        FetchError(code="http_error"): The name does not resolve, or has no address.
    """
    name = host.strip("[]").rstrip(".").lower()
    literal = ip_literal(name)
    if literal is not None:
        return [literal]
    try:
        infos = await _getaddrinfo(name, port)
    except (socket.gaierror, UnicodeError) as exc:
        raise FetchError(f"Cannot resolve host {host!r}: {exc}.", code="http_error") from exc
    addresses: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise FetchError(f"Host {host!r} has no addresses.", code="http_error")
    return addresses


def ip_literal(name: str) -> IPAddress | None:
    """``name`` as an IP address (brackets stripped), or None when it is a host name."""
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def peer_ip(stream: Any) -> IPAddress | None:
    """The peer address of a connected httpcore/httpcore2 network stream, or None when unknown."""
    sock = stream.get_extra_info("socket")
    if sock is None:
        return None
    try:
        return ipaddress.ip_address(str(sock.getpeername()[0]).split("%", 1)[0])
    except (OSError, ValueError):
        return None


def validate_url(url: Any) -> httpx.URL:
    """Parse and check a URL the model gave.

    Raises:
        FetchError(code="invalid_url"): Not a string, too long, not http(s), no host,
            credentials in it, or unparseable.
    """
    if not isinstance(url, str) or not url.strip():
        raise FetchError("`url` must be a non-empty string such as 'https://example.com/page'.", code="invalid_url")
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise FetchError(f"The URL is longer than {MAX_URL_LENGTH} characters.", code="invalid_url")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise FetchError(f"Invalid URL {url!r}: {exc}.", code="invalid_url") from exc
    if parsed.scheme not in ("http", "https"):
        raise FetchError(
            f"Only http and https URLs can be fetched, not {parsed.scheme or 'a URL without a scheme'!r}"
            + ("" if parsed.scheme else " (add 'https://')") + ".",
            code="invalid_url",
        )
    if not parsed.host:
        raise FetchError(f"The URL {url!r} has no host.", code="invalid_url")
    raw_host = parsed.raw_host.decode("ascii", errors="replace")
    if not (HOST_NAME.fullmatch(raw_host) or ip_literal(raw_host) is not None):
        raise FetchError(f"The URL {url!r} has an invalid host name.", code="invalid_url")
    if parsed.userinfo:
        raise FetchError("URLs with a user name or password are not fetched.", code="invalid_url")
    return parsed


# ------------------------------------------------------------------------------------------ outbound
#
# The same address rules for the connections the platform itself makes on a tenant's behalf:
# model providers (chat and the route test) and remote MCP servers (streamable HTTP, SSE).
# A tenant admin types those URLs, so they are checked when saved (check_outbound_url) AND
# at every TCP connect (OutboundBackend for httpx2, OutboundResolver for aiohttp), which
# resolve the name once, check every address, and connect only to the checked addresses (no
# DNS-rebinding window). Redirects open new connections and are checked the same way.

def outbound_allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``settings.OUTBOUND_ALLOWED_CIDRS`` as networks: non-public ranges that providers and
    MCP servers may be reached at (empty by default; tests allow 127.0.0.0/8)."""
    return [ipaddress.ip_network(c, strict=False) for c in getattr(settings, "OUTBOUND_ALLOWED_CIDRS", ()) or ()]


def _host_port_key(host: str, port: int) -> str:
    host = host.strip("[]").rstrip(".").lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def outbound_host_allowed(host: str, port: int) -> bool:
    """Whether ``host:port`` is listed in ``settings.OUTBOUND_ALLOWED_HOSTS`` (exact host name
    or IP literal, and port; default: the embedded model's ``LLM_BASE_URL`` host and port).
    A listed host is reached at whatever it resolves to, except cloud metadata addresses."""
    listed = getattr(settings, "OUTBOUND_ALLOWED_HOSTS", ()) or ()
    key = _host_port_key(host, port)
    for entry in listed:
        entry = str(entry).strip().lower()
        if not entry:
            continue
        try:
            parsed = httpx.URL(f"http://{entry}")
        except (httpx.InvalidURL, ValueError):
            continue
        if parsed.host and parsed.port is not None and _host_port_key(parsed.host, parsed.port) == key:
            return True
    return False


async def resolve_outbound(host: str, port: int) -> list[IPAddress]:
    """Resolve ``host`` once for a platform connection on a tenant's behalf and return the
    addresses that may be connected to (IPv4 first).

    Rules: those of :func:`resolve_host` with ``OUTBOUND_ALLOWED_CIDRS`` as the allowed
    networks; a ``host:port`` listed in ``OUTBOUND_ALLOWED_HOSTS`` skips the address check
    (cloud metadata addresses stay refused).

    Raises:
        FetchError(code="blocked_address"): A blocked name or address.
        FetchError(code="http_error"): The name does not resolve.
    """
    if not outbound_host_allowed(host, port):
        return await resolve_host(host, port, allowed=outbound_allowed_networks())
    addresses = await lookup_addresses(host, port)
    for ip in addresses:
        if ip in METADATA_ADDRESSES:
            raise FetchError(f"Refused: {host!r} resolves to a cloud metadata address.", code="blocked_address")
    return sorted(addresses, key=lambda a: a.version)


def check_outbound_url(url: Any) -> None:
    """Validate a provider base URL or MCP server URL when it is saved (the connect-time
    check in :class:`OutboundBackend` / :class:`OutboundResolver` is the authoritative one).

    Checks: http(s), a host, no user name or password, and the address rules of
    :func:`resolve_outbound`: an IP literal or ``localhost`` name that is not allowed, or a
    name that resolves (now) to a blocked address, is refused. A name that does not resolve
    now passes (it is checked again at every connect). Blocking DNS lookup (synchronous).

    Raises:
        FetchError: ``invalid_url`` or ``blocked_address``; ``message`` says why.
    """
    parsed = validate_url(url)
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if outbound_host_allowed(host, port):
        return
    name = host.strip("[]").rstrip(".").lower()
    networks = outbound_allowed_networks()
    if name in METADATA_HOSTNAMES:
        raise FetchError(f"Refused: {host!r} is a cloud metadata service.", code="blocked_address")
    literal = ip_literal(name)
    if literal is None and (name == "localhost" or name.endswith(".localhost")):
        literal = ipaddress.ip_address("127.0.0.1")
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError, OSError):
            return
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    for ip in addresses:
        reason = address_block_reason(ip, allowed=networks)
        if reason:
            shown = host if literal is not None and name == str(literal) else f"{host!r} (resolves to {ip})"
            raise FetchError(
                f"Refused: {shown} is a {reason} address. Only public internet addresses are allowed; "
                "an operator can allow internal hosts (OUTBOUND_ALLOWED_HOSTS, OUTBOUND_ALLOWED_CIDRS).",
                code="blocked_address",
            )


def _httpcore2() -> Any:
    import httpcore2

    return httpcore2


class OutboundBackend:
    """An httpcore2 network backend (httpx2, as the openai/anthropic/mcp SDKs use it) that
    resolves every host with :func:`resolve_outbound` and connects only to the addresses it
    checked, then checks the socket's peer address again. Unix sockets are refused.

    Built through :func:`outbound_backend` (a subclass of ``httpcore2.AsyncNetworkBackend``).
    """

    def __init__(self) -> None:
        self._inner = _httpcore2().AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> Any:
        httpcore2 = _httpcore2()
        try:
            addresses = await resolve_outbound(host, port)
        except FetchError as exc:
            raise httpcore2.ConnectError(exc.message) from exc
        allowed = outbound_allowed_networks()
        last: Exception | None = None
        for ip in addresses:
            try:
                stream = await self._inner.connect_tcp(str(ip), port, timeout=timeout, local_address=local_address,
                                                       socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout, OSError) as exc:
                last = exc
                continue
            peer = peer_ip(stream)
            if peer is None or peer != ip or (
                ip in METADATA_ADDRESSES
                or (not outbound_host_allowed(host, port) and address_block_reason(peer, allowed=allowed))
            ):
                await stream.aclose()
                raise httpcore2.ConnectError(f"connected to unexpected address {peer}")
            return stream
        if isinstance(last, httpcore2.ConnectTimeout):
            raise last
        raise httpcore2.ConnectError(str(last) if last else "no address to connect to")

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise _httpcore2().ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@functools.cache
def _outbound_backend_class() -> type:
    return type("OutboundNetworkBackend", (OutboundBackend, _httpcore2().AsyncNetworkBackend), {})


def outbound_backend() -> Any:
    """A new :class:`OutboundBackend` (an ``httpcore2.AsyncNetworkBackend``)."""
    return _outbound_backend_class()()


@functools.cache
def _default_httpx2_ssl_context() -> ssl.SSLContext:
    """httpx2's default verifying TLS context (certifi's CAs, ``SSL_CERT_FILE``/``SSL_CERT_DIR``
    honoured), built once per process."""
    import httpx2

    return httpx2.create_ssl_context()


def _httpcore_error_map() -> tuple[tuple[type[Exception], type[Exception]], ...]:
    """httpcore2 error → httpx2 error, as httpx2's own transport maps them (most specific wins)."""
    import httpcore2
    import httpx2

    return (
        (httpcore2.TimeoutException, httpx2.TimeoutException), (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
        (httpcore2.ReadTimeout, httpx2.ReadTimeout), (httpcore2.WriteTimeout, httpx2.WriteTimeout),
        (httpcore2.PoolTimeout, httpx2.PoolTimeout), (httpcore2.NetworkError, httpx2.NetworkError),
        (httpcore2.ConnectError, httpx2.ConnectError), (httpcore2.ReadError, httpx2.ReadError),
        (httpcore2.WriteError, httpx2.WriteError), (httpcore2.ProxyError, httpx2.ProxyError),
        (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol), (httpcore2.ProtocolError, httpx2.ProtocolError),
        (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
        (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    )


@contextlib.contextmanager
def _httpx2_errors() -> Iterator[None]:
    """Re-raise httpcore2 errors as the httpx2 errors the SDKs expect; others unchanged."""
    try:
        yield
    except Exception as exc:
        target: type[Exception] | None = None
        for source, candidate in _httpcore_error_map():
            if isinstance(exc, source) and (target is None or issubclass(candidate, target)):
                target = candidate
        if target is None:
            raise
        raise target(str(exc)) from exc


class _OutboundBody:
    """A response body of :class:`OutboundTransport` (an ``httpx2.AsyncByteStream``)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx2_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        if hasattr(self._stream, "aclose"):
            await self._stream.aclose()


class OutboundTransport:
    """An ``httpx2`` transport over an ``httpcore2.AsyncConnectionPool`` whose network backend
    is :class:`OutboundBackend`: every TCP connect is resolved and checked by the outbound
    rules. Built from httpx2's and httpcore2's public APIs (httpx2's own ``AsyncHTTPTransport``
    takes no network backend); requests, responses and errors are mapped as httpx2's own
    transport maps them. Built through :func:`outbound_transport` (a subclass of
    ``httpx2.AsyncBaseTransport``).
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        """The ``httpcore2.AsyncConnectionPool``."""

    async def handle_async_request(self, request: Any) -> Any:
        """Send an ``httpx2.Request`` on the pool; the streamed ``httpx2.Response``."""
        import httpcore2
        import httpx2

        core_request = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                              target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions,
        )
        with _httpx2_errors():
            response = await self.pool.handle_async_request(core_request)
        return httpx2.Response(status_code=response.status, headers=response.headers,
                               stream=_outbound_body_class()(response.stream), extensions=response.extensions)

    async def aclose(self) -> None:
        """Close the pool and its connections."""
        await self.pool.aclose()


@functools.cache
def _outbound_transport_class() -> type:
    import httpx2

    return type("OutboundHTTPTransport", (OutboundTransport, httpx2.AsyncBaseTransport), {})


@functools.cache
def _outbound_body_class() -> type:
    import httpx2

    return type("OutboundResponseBody", (_OutboundBody, httpx2.AsyncByteStream), {})


def outbound_transport(*, verify: Any = True, limits: Any = None, http2: bool = False) -> Any:
    """An ``httpx2`` transport whose connections go through :class:`OutboundBackend`
    (:class:`OutboundTransport`).

    Args:
        verify: TLS verification (an ``ssl.SSLContext``, a CA path or a bool), as httpx2 takes it.
        limits: ``httpx2.Limits`` (httpx2's defaults when None).
        http2: Offer HTTP/2.

    Returns:
        The transport: pass it as ``transport=`` to an ``httpx2.AsyncClient`` (or the SDKs'
        ``DefaultAsyncHttpxClient``). No proxies from the environment.
    """
    import httpcore2
    import httpx2

    limits = limits or httpx2.Limits(max_connections=100, max_keepalive_connections=20)
    if isinstance(verify, ssl.SSLContext):
        ssl_context = verify
    elif verify is True:
        ssl_context = _default_httpx2_ssl_context()  # built once: loading the CA bundle costs ~20 ms
    else:
        ssl_context = httpx2.create_ssl_context(verify=verify)
    pool = httpcore2.AsyncConnectionPool(
        ssl_context=ssl_context, max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        http1=True, http2=http2, network_backend=outbound_backend(),
    )
    return _outbound_transport_class()(pool)


class OutboundResolver:
    """An aiohttp resolver applying :func:`resolve_outbound`: aiohttp then connects only to
    the addresses returned (checked). Built through :func:`outbound_resolver` (a subclass of
    ``aiohttp.abc.AbstractResolver``).

    aiohttp does not ask the resolver about IP literals: pair it with
    :meth:`socket_factory`, which checks every address aiohttp connects to (and lets through
    the ones this resolver approved, e.g. an operator-allowed host name on a private address).
    """

    def __init__(self) -> None:
        self.approved: set[tuple[str, int]] = set()
        """``(ip, port)`` this resolver returned (checked by :func:`resolve_outbound`)."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        try:
            addresses = await resolve_outbound(host, port)
        except FetchError as exc:
            raise OSError(errno.EACCES, exc.message) from exc
        self.approved.update((str(ip), port) for ip in addresses)
        out = []
        for ip in addresses:
            if family == socket.AF_INET6 and ip.version == 4 or family == socket.AF_INET and ip.version == 6:
                continue
            out.append({"hostname": host, "host": str(ip), "port": port,
                        "family": socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                        "proto": 0, "flags": socket.AI_NUMERICHOST})
        if not out:
            raise OSError(errno.EADDRNOTAVAIL, f"Host {host!r} has no allowed address of the requested family.")
        return out

    async def close(self) -> None:
        return None

    def socket_factory(self, addr_info: tuple[Any, ...]) -> socket.socket:
        """aiohttp's ``socket_factory``: the socket for one address aiohttp is about to connect
        to, or ``OSError`` (EACCES) when the outbound rules refuse that address."""
        family, type_, proto, _canonname, sockaddr = addr_info
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        port = int(sockaddr[1])
        if (str(ip), port) not in self.approved:
            reason = "cloud metadata" if ip in METADATA_ADDRESSES else (
                None if outbound_host_allowed(str(ip), port)
                else address_block_reason(ip, allowed=outbound_allowed_networks()))
            if reason:
                raise OSError(errno.EACCES, f"Refused: {ip} is a {reason} address. Only public internet addresses "
                                            "are allowed; an operator can allow internal hosts.")
        return socket.socket(family, type_, proto)


@functools.cache
def _outbound_resolver_class() -> type:
    import aiohttp.abc

    return type("OutboundAiohttpResolver", (OutboundResolver, aiohttp.abc.AbstractResolver), {})


def outbound_resolver() -> Any:
    """A new :class:`OutboundResolver` (an ``aiohttp.abc.AbstractResolver``)."""
    return _outbound_resolver_class()()
