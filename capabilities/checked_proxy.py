"""An HTTP/1.1 forward proxy that checks every destination before it connects: the one
connection handler behind the sandbox's egress proxy (:mod:`capabilities.egress`) and the
server browser's proxy (``browser/proxy.py``), each with its own address check.

:func:`serve_connection` serves one client connection:

- ``CONNECT host:port``: ``check(host, port)`` resolves the host once and returns the addresses
  it allows (or raises :class:`ProxyRefused`); the tunnel goes to one of those addresses, never
  to a second lookup's answer. TLS stays end to end.
- a plain-HTTP request in absolute form (``GET http://host/path``): the same check, then
  **one request per client connection**: the request goes to the checked address in origin
  form with ``Connection: close`` (its body by ``Content-Length`` only; a chunked request body
  is refused with 411), the response's ``Connection`` header is rewritten to ``close`` and the
  exchange ends after the response's declared body (``Content-Length``; none for HEAD, 204,
  304), or when the server closes. Nothing the client sends after the request (a second,
  pipelined or kept-alive request for another host, with that host's cookies) ever reaches
  this upstream: the client opens a new connection, and that one is checked again.

Hop-by-hop headers (:data:`HOP_BY_HOP`, ``Proxy-*`` among them) are never passed on. A refusal
is an HTTP answer (403 for a refused address, 502 for a name that does not resolve or a server
that cannot be reached or does not answer, 400/411 for a malformed request) whose body says
why and whose :data:`REFUSED_HEADER` header carries the same reason in ASCII.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import urllib.parse
from collections.abc import Awaitable, Callable

REFUSED_HEADER = "X-Agent-Platform-Refused"
"""Header of the proxy's own refusal answers: the reason, in ASCII."""
HEAD_LIMIT_BYTES = 64 * 1024
"""Largest request or response head (request/status line and headers) read, bytes. Pass it as
the ``limit`` of the server's stream readers."""
HEAD_TIMEOUT_SECONDS = 30.0
"""Waiting for the client's request head, and for the server's response head, seconds."""
CONNECT_TIMEOUT_SECONDS = 10.0
"""Resolving plus connecting to the server, seconds."""
CHUNK_BYTES = 64 * 1024
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer",
    "upgrade",
})
"""Request and response headers that concern one connection only: never passed on."""

Check = Callable[[str, int], Awaitable[list[str]]]
"""``check(host, port)``: the addresses (strings) the proxy may connect to for ``host``, or
:class:`ProxyRefused`."""


class ProxyRefused(Exception):
    """A request the proxy answers itself; ``status`` is the HTTP status, ``message`` why."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def request_target(method: str, target: str) -> tuple[str, int, str]:
    """Split a proxy request's target.

    Args:
        method: The request method (``CONNECT`` takes ``host:port``).
        target: ``host:port`` for CONNECT, else an absolute ``http://`` URL.

    Returns:
        ``(host, port, origin-form path)``; the path is ``""`` for CONNECT.

    Raises:
        ProxyRefused: 400 for a malformed target, an origin-form target or another scheme.
    """
    if method == "CONNECT":
        host, sep, port_text = target.rpartition(":")
        if not sep or not port_text.isdigit() or not host:
            raise ProxyRefused(f"Bad CONNECT target {target[:200]!r}.", status=400)
        return host, int(port_text), ""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise ProxyRefused("Only absolute http:// URLs (or CONNECT for https) go through this proxy.", status=400)
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


def _request_length(headers: list[tuple[str, str]]) -> int:
    """Bytes of request body (``Content-Length``, 0 without); raises ProxyRefused (411 for a
    chunked body, 400 for a bad length)."""
    if any(k.lower() == "transfer-encoding" for k, _ in headers):
        raise ProxyRefused("A chunked request body is not supported; send Content-Length.", status=411)
    declared = [v for k, v in headers if k.lower() == "content-length"]
    if declared and (len(set(declared)) > 1 or not declared[0].isdigit()):
        raise ProxyRefused("Bad Content-Length.", status=400)
    return int(declared[0]) if declared else 0


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


async def _relay_http(method: str, path: str, headers: list[tuple[str, str]], length: int,
                      client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                      upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    """One plain-HTTP exchange: the request (body of ``length`` bytes) up, the response down,
    both with ``Connection: close``; nothing more is read from the client."""
    (client_reader, client_writer), (upstream_reader, upstream_writer) = client, upstream
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
    try:
        head = await asyncio.wait_for(upstream_reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
    except TimeoutError as exc:
        raise ProxyRefused(f"The server sent no answer within {HEAD_TIMEOUT_SECONDS:.0f} s.", status=502) from exc
    except asyncio.LimitOverrunError as exc:
        raise ProxyRefused(f"The server's response head is over {HEAD_LIMIT_BYTES} bytes.", status=502) from exc
    except asyncio.IncompleteReadError as exc:
        raise ProxyRefused("The server closed the connection without an answer.", status=502) from exc
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


async def serve_connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, *,
                           check: Check, logger: logging.Logger, label: str) -> None:
    """Serve one client connection of a checking proxy (the module docstring says how), then
    close both sides. Bind ``check``, ``logger`` and ``label`` with :func:`functools.partial`
    and pass the result to :func:`asyncio.start_server` / ``start_unix_server`` with
    ``limit=HEAD_LIMIT_BYTES``.

    Args:
        client_reader, client_writer: The client's connection.
        check: The destination check (:data:`Check`); its :class:`ProxyRefused` is answered to
            the client.
        logger: Where refusals are logged (INFO for 403, DEBUG otherwise).
        label: Names the proxy in log lines ("egress", "server browser").

    Never raises for the client's or the server's misbehaviour (timeouts, early closes): the
    connection just ends.
    """
    upstream_writer: asyncio.StreamWriter | None = None
    method, target = "", ""
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
            host, port, path = request_target(method, target)
            length = 0 if method == "CONNECT" else _request_length(headers)
            try:
                addresses = await asyncio.wait_for(check(host, port), CONNECT_TIMEOUT_SECONDS)
            except TimeoutError as exc:
                raise ProxyRefused(f"Resolving {host!r} timed out.", status=502) from exc
            upstream_reader, upstream_writer = await _connect(host, port, addresses)
            if method == "CONNECT":
                client_writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await client_writer.drain()
                await asyncio.gather(_splice(client_reader, upstream_writer), _splice(upstream_reader, client_writer))
            else:
                await _relay_http(method, path, headers, length, (client_reader, client_writer),
                                  (upstream_reader, upstream_writer))
        except ProxyRefused as exc:
            logger.log(logging.INFO if exc.status == 403 else logging.DEBUG, "%s proxy refused %s %s: %s", label,
                       method, target[:200], exc.message)
            await _answer(client_writer, exc.status, exc.message)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        logger.debug("%s proxy connection ended early: %s %s", label, method, target[:200], exc_info=True)
    finally:
        for writer in (client_writer, upstream_writer):
            if writer is not None:
                writer.close()


def loop_thread_start(start: Callable[[], Awaitable[None]], *, name: str,
                      ready_seconds: float = 10) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop running forever in a daemon thread ``name``, after ``start()`` (which
    opens the proxy's listening socket on it) has completed.

    Returns:
        ``(loop, thread)``.

    Raises:
        BaseException: what ``start()`` raised (e.g. ``OSError`` for a socket it cannot bind),
            in the calling thread.
    """
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as exc:  # reported to the starting thread
            errors.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait(ready_seconds)
    if errors:
        raise errors[0]
    return loop, thread
