"""The egress proxy: the one way out of a sandbox, with web_fetch's address rules.

A confined program with ``network="egress"`` (:mod:`capabilities.confinement`) has a network
namespace of its own; its only route out is this proxy's Unix socket, bound into the sandbox
and reached through the bridge on the sandbox's loopback (``HTTP_PROXY``/``HTTPS_PROXY``).

The proxy speaks HTTP/1.1 proxy requests:

- ``CONNECT host:port`` (HTTPS and any other TLS): the host is resolved once, **every**
  address must pass :func:`capabilities.netsafe.address_block_reason` (public internet only:
  no loopback, private, link-local, CGNAT, ULA, metadata …), and the tunnel goes to the
  checked address. TLS stays end to end between the program and the server.
- ``GET http://host/path`` and the other methods in absolute form (plain HTTP): the same
  check, then the request goes to the checked address in origin form; ``Proxy-*`` headers
  are dropped.

Anything else, a refused address, a name that does not resolve or a server that cannot be
reached is answered with an HTTP error (403, 400 or 502) whose text says why, so the program
(and through it the model) reads a reason instead of a hang. Networks listed in
``settings.SANDBOX_EGRESS_ALLOWED_CIDRS`` are allowed although not public (an operator's
decision; tests allow 127.0.0.1); cloud metadata addresses and host names stay refused.

One proxy per process, on a daemon thread with its own event loop, started on first use
(:func:`egress_socket_path`): the worker's run host, a Celery task and a test all share it.
The socket lives in a fresh directory under the system temp dir (mode 0755, socket 0666, so
that the unprivileged sandbox user can connect).
"""

from __future__ import annotations

import asyncio
import atexit
import ipaddress
import logging
import os
import shutil
import tempfile
import threading
import urllib.parse
from typing import Any

from capabilities.netsafe import FetchError, resolve_host

logger = logging.getLogger(__name__)

HEAD_LIMIT_BYTES = 64 * 1024
"""Largest request head (request line and headers) the proxy reads."""
HEAD_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10.0
"""Resolving plus connecting to the server."""
SPLICE_CHUNK_BYTES = 64 * 1024


class EgressRefused(Exception):
    """A destination the egress rules refuse; ``status`` is the HTTP status answered."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _allowed_networks() -> list[Any]:
    from django.conf import settings

    return [ipaddress.ip_network(c, strict=False) for c in getattr(settings, "SANDBOX_EGRESS_ALLOWED_CIDRS", ()) or ()]


async def egress_check(host: str, port: int) -> list[str]:
    """Resolve ``host`` once and return its addresses if every one may be reached: web_fetch's
    rules (:func:`capabilities.netsafe.resolve_host`) with ``SANDBOX_EGRESS_ALLOWED_CIDRS`` as the
    operator's allowed networks.

    Args:
        host: A host name or an IP literal (IPv6 with or without brackets).
        port: 1-65535.

    Returns:
        The addresses (strings), IPv4 first.

    Raises:
        EgressRefused: 403 for a blocked name or address (the reason names it), 400 for a bad
            port, 502 for a name that does not resolve.
    """
    if not 0 < port < 65536:
        raise EgressRefused(f"Refused: port {port} is not valid.", status=400)
    try:
        addresses = await resolve_host(host.strip("[]"), port, allowed=_allowed_networks())
    except FetchError as exc:
        if exc.code != "blocked_address":
            raise EgressRefused(exc.message, status=502) from exc
        reason = exc.message.removeprefix("Refused: ")
        raise EgressRefused(f"Refused by the platform's egress rules: {reason}") from exc
    return [str(ip) for ip in addresses]


def _target(method: str, target: str) -> tuple[str, int, str]:
    """``(host, port, origin-form path)`` of a request target; raises EgressRefused (400)."""
    if method == "CONNECT":
        host, sep, port_text = target.rpartition(":")
        if not sep or not port_text.isdigit():
            raise EgressRefused(f"Bad CONNECT target {target[:200]!r}.", status=400)
        return host, int(port_text), ""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise EgressRefused("Only absolute http:// URLs (or CONNECT for https) go through the egress proxy.", status=400)
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise EgressRefused(f"Bad port in {target[:200]!r}.", status=400) from exc
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, port, path


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
    body = (message + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    )
    try:
        await writer.drain()
    except OSError:
        pass


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(SPLICE_CHUNK_BYTES):
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
        method, target, version = request
        try:
            host, port, path = _target(method, target)
            addresses = await asyncio.wait_for(egress_check(host, port), CONNECT_TIMEOUT_SECONDS)
        except EgressRefused as exc:
            logger.info("egress refused: %s %s: %s", method, target[:200], exc.message)
            await _answer(client_writer, exc.status, exc.message)
            return
        except TimeoutError:
            await _answer(client_writer, 502, f"Resolving {host!r} timed out.")
            return
        last_error: Exception | None = None
        for address in addresses:
            try:
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=SPLICE_CHUNK_BYTES), CONNECT_TIMEOUT_SECONDS
                )
                break
            except (OSError, TimeoutError) as exc:
                last_error = exc
        if upstream_writer is None:
            await _answer(client_writer, 502, f"Cannot connect to {host}:{port}: {last_error or 'no address'}.")
            return
        if method == "CONNECT":
            client_writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await client_writer.drain()
        else:
            kept = [line for line in lines[1:] if line and not line.lower().startswith(("proxy-",))]
            upstream_writer.write(("\r\n".join([f"{method} {path} {version}", *kept]) + "\r\n\r\n").encode("latin-1"))
            await upstream_writer.drain()
        await asyncio.gather(_splice(client_reader, upstream_writer), _splice(upstream_reader, client_writer))
    finally:
        for writer in (client_writer, upstream_writer):
            if writer is not None:
                writer.close()


class _Proxy:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="ap-egress-")
        os.chmod(self.directory, 0o755)
        self.path = os.path.join(self.directory, "egress.sock")
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        errors: list[BaseException] = []

        async def start() -> None:
            await asyncio.start_unix_server(_handle, path=self.path, limit=HEAD_LIMIT_BYTES)
            os.chmod(self.path, 0o666)

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

        self.thread = threading.Thread(target=run, name="egress-proxy", daemon=True)
        self.thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        atexit.register(shutil.rmtree, self.directory, True)


_proxy: _Proxy | None = None
_proxy_pid = 0
_proxy_lock = threading.Lock()


def egress_socket_path() -> str:
    """The host path of this process's egress proxy socket, starting the proxy on first use.

    A forked child starts its own (the parent's thread does not survive a fork).
    """
    global _proxy, _proxy_pid
    with _proxy_lock:
        if _proxy is None or _proxy_pid != os.getpid():
            _proxy = _Proxy()
            _proxy_pid = os.getpid()
        return _proxy.path
