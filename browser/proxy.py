"""The server browser's only way out: an HTTP proxy on the worker's loopback with web_fetch's
address rules.

The server-side Chromium (:mod:`browser.server_backend`) runs with ``--proxy-server`` pointing
here and no proxy bypass (not even for loopback), so every connection it makes (navigations,
redirect hops, subresources, form posts, ``fetch``/XHR, WebSockets, service workers, prefetch)
arrives here first. For each one:

- ``CONNECT host:port`` (https, wss, and ws, which Chromium tunnels too): the host is resolved
  **once** (:func:`capabilities.netsafe.resolve_host`), **every** address must pass web_fetch's
  rules (public internet only: no loopback, private, link-local, CGNAT, ULA, cloud metadata …;
  networks in ``settings.WEB_FETCH_ALLOWED_CIDRS`` allowed, metadata never), and the tunnel
  goes to one of the checked addresses. There is no second lookup, so a DNS-rebinding answer
  cannot swap the address between check and connect.
- a plain-HTTP request in absolute form (``GET http://host/path``): the same check, then
  **one request per client connection**: the request goes to the checked address in origin
  form with ``Connection: close`` (the body by ``Content-Length`` only; a chunked request body
  is refused), and the response's ``Connection`` header is rewritten to ``close``. A kept-alive
  proxy connection therefore never carries a request for another host to this upstream.

A refusal is an HTTP answer (403 for a blocked address, 502 for a name that does not resolve
or a server that cannot be reached, 400/411 for a malformed request) whose body says why and
whose :data:`REFUSED_HEADER` header carries the same reason, so the server backend can tell
the model why a page did not load.

One proxy per process, on a daemon thread with its own event loop, listening on
``127.0.0.1`` at a free port (:func:`browser_proxy_address`, started on first use). Who can
reach it: processes of the worker's host (confined programs have their own network namespace);
it only ever connects to addresses the rules allow.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import urllib.parse

from capabilities.netsafe import FetchError, resolve_host

logger = logging.getLogger(__name__)

REFUSED_HEADER = "X-Agent-Platform-Refused"
"""Header of the proxy's own refusal answers: the reason, in ASCII."""
HEAD_LIMIT_BYTES = 64 * 1024
"""Largest request or response head (request/status line and headers) read, bytes."""
HEAD_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10.0
"""Resolving plus connecting to the server, seconds."""
CHUNK_BYTES = 64 * 1024
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer",
    "upgrade",
})
"""Request and response headers that concern one connection only: never passed on."""


class ProxyRefused(Exception):
    """A request the proxy answers itself; ``status`` is the HTTP status, ``message`` why."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


async def destination_check(host: str, port: int) -> list[str]:
    """Resolve ``host`` once and return its addresses if the server browser may reach every one.

    Args:
        host: A host name or an IP literal (IPv6 with or without brackets).
        port: 1-65535.

    Returns:
        The checked addresses (strings), IPv4 first: connect only to these.

    Raises:
        ProxyRefused: 403 for a blocked name or address (web_fetch's message: "Refused: … is a
            loopback address …"), 400 for a bad port, 502 for a name that does not resolve.
    """
    if not 0 < port < 65536:
        raise ProxyRefused(f"Refused: port {port} is not valid.", status=400)
    try:
        addresses = await resolve_host(host.strip("[]"), port)
    except FetchError as exc:
        raise ProxyRefused(exc.message, status=403 if exc.code == "blocked_address" else 502) from exc
    return [str(ip) for ip in addresses]


def _target(method: str, target: str) -> tuple[str, int, str]:
    """``(host, port, origin-form path)`` of a request target; raises ProxyRefused (400)."""
    if method == "CONNECT":
        host, sep, port_text = target.rpartition(":")
        if not sep or not port_text.isdigit() or not host:
            raise ProxyRefused(f"Bad CONNECT target {target[:200]!r}.", status=400)
        return host, int(port_text), ""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ProxyRefused("Only absolute http:// URLs (or CONNECT) go through this proxy.", status=400)
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ProxyRefused(f"Bad port in {target[:200]!r}.", status=400) from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, path


def _ascii(text: str, limit: int = 400) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:limit]


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 411: "Length Required", 502: "Bad Gateway"}.get(status, "Error")
    body = (message + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n{REFUSED_HEADER}: {_ascii(message)}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    )
    try:
        await writer.drain()
    except OSError:
        pass


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            pass


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.append((name.strip(), value.strip()))
    return out


async def _connect(host: str, port: int, addresses: list[str]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    last: Exception | None = None
    for address in addresses:
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port, limit=HEAD_LIMIT_BYTES),
                                          CONNECT_TIMEOUT_SECONDS)
        except (OSError, TimeoutError) as exc:
            last = exc
    raise ProxyRefused(f"Cannot connect to {host}:{port}: {last or 'no address'}.", status=502)


async def _relay_http(method: str, path: str, headers: list[tuple[str, str]], client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter, upstream_reader: asyncio.StreamReader,
                      upstream_writer: asyncio.StreamWriter, length: int) -> None:
    """One plain-HTTP exchange: the request (body of ``length`` bytes) up, the response down,
    both with ``Connection: close``."""
    kept = [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
    upstream_writer.write(("\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close"]) + "\r\n\r\n")
                          .encode("latin-1"))
    remaining = length
    while remaining > 0:
        data = await client_reader.read(min(CHUNK_BYTES, remaining))
        if not data:
            break
        upstream_writer.write(data)
        remaining -= len(data)
        await upstream_writer.drain()
    await upstream_writer.drain()
    head = await asyncio.wait_for(upstream_reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
    lines = head.decode("latin-1").split("\r\n")
    status_line, response_headers = lines[0], _headers(lines[1:])
    kept = [f"{k}: {v}" for k, v in response_headers if k.lower() not in HOP_BY_HOP]
    client_writer.write(("\r\n".join([status_line, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
    await client_writer.drain()
    body = _response_length(method, status_line, response_headers)
    if body is None:  # until the server closes (it was asked to)
        await _splice(upstream_reader, client_writer)
        return
    while body > 0:  # exactly the declared body: a server that keeps the connection open anyway is not waited for
        data = await upstream_reader.read(min(CHUNK_BYTES, body))
        if not data:
            break
        client_writer.write(data)
        body -= len(data)
        await client_writer.drain()


def _response_length(method: str, status_line: str, headers: list[tuple[str, str]]) -> int | None:
    """Bytes of body after a response head, or None when the body ends when the server closes
    (chunked, no length, or an interim 1xx answer followed by the final one)."""
    parts = status_line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if 100 <= status < 200:
        return None
    if method == "HEAD" or status in (204, 304):
        return 0
    if any(k.lower() == "transfer-encoding" for k, _ in headers):
        return None
    declared = {v for k, v in headers if k.lower() == "content-length"}
    if len(declared) == 1 and (value := declared.pop()).isdigit():
        return int(value)
    return None


async def _handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    upstream_writer: asyncio.StreamWriter | None = None
    try:
        try:
            head = await asyncio.wait_for(client_reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            return
        lines = head.decode("latin-1").split("\r\n")
        request = lines[0].split(" ")
        if len(request) != 3:
            await _answer(client_writer, 400, "Not an HTTP proxy request.")
            return
        method, target, _version = request
        headers = _headers(lines[1:])
        try:
            host, port, path = _target(method, target)
            length = 0
            if method != "CONNECT":
                if any(k.lower() == "transfer-encoding" for k, _ in headers):
                    raise ProxyRefused("A chunked request body is not supported; send Content-Length.", status=411)
                declared = [v for k, v in headers if k.lower() == "content-length"]
                if declared and (len(set(declared)) > 1 or not declared[0].isdigit()):
                    raise ProxyRefused("Bad Content-Length.", status=400)
                length = int(declared[0]) if declared else 0
            try:
                addresses = await asyncio.wait_for(destination_check(host, port), CONNECT_TIMEOUT_SECONDS)
            except TimeoutError as exc:
                raise ProxyRefused(f"Resolving {host!r} timed out.", status=502) from exc
            upstream_reader, upstream_writer = await _connect(host, port, addresses)
        except ProxyRefused as exc:
            logger.log(logging.INFO if exc.status == 403 else logging.DEBUG, "server browser request refused: %s %s: %s",
                       method, target[:200], exc.message)
            await _answer(client_writer, exc.status, exc.message)
            return
        if method == "CONNECT":
            client_writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await client_writer.drain()
            await asyncio.gather(_splice(client_reader, upstream_writer), _splice(upstream_reader, client_writer))
        else:
            await _relay_http(method, path, headers, client_reader, client_writer, upstream_reader, upstream_writer,
                              length)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        logger.debug("server browser proxy connection ended early", exc_info=True)
    finally:
        for writer in (client_writer, upstream_writer):
            if writer is not None:
                writer.close()


class _Proxy:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.address: tuple[str, int] = ("127.0.0.1", 0)
        ready = threading.Event()
        errors: list[BaseException] = []

        async def start() -> None:
            server = await asyncio.start_server(_handle, host="127.0.0.1", port=0, limit=HEAD_LIMIT_BYTES)
            self.address = server.sockets[0].getsockname()[:2]

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(start())
            except BaseException as exc:  # reported to the starting thread
                errors.append(exc)
                ready.set()
                return
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="browser-proxy", daemon=True)
        self.thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]


_proxy: _Proxy | None = None
_proxy_pid = 0
_proxy_lock = threading.Lock()


def browser_proxy_address() -> tuple[str, int]:
    """``(host, port)`` of this process's server-browser proxy, starting it on first use.

    A forked child starts its own (the parent's thread does not survive a fork).
    """
    global _proxy, _proxy_pid
    with _proxy_lock:
        if _proxy is None or _proxy_pid != os.getpid():
            _proxy = _Proxy()
            _proxy_pid = os.getpid()
        return _proxy.address
