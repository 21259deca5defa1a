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
import functools
import logging
import os
import threading

from capabilities.checked_proxy import (
    HEAD_LIMIT_BYTES,
    REFUSED_HEADER,
    ProxyRefused,
    loop_thread_start,
    serve_connection,
)
from capabilities.netsafe import FetchError, resolve_host

logger = logging.getLogger(__name__)

__all__ = ["REFUSED_HEADER", "ProxyRefused", "browser_proxy_address", "destination_check"]

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


_handle = functools.partial(serve_connection, check=destination_check, logger=logger, label="server browser")
"""One client connection: :func:`capabilities.checked_proxy.serve_connection` with web_fetch's check."""


class _Proxy:
    def __init__(self) -> None:
        self.address: tuple[str, int] = ("127.0.0.1", 0)

        async def start() -> None:
            server = await asyncio.start_server(_handle, host="127.0.0.1", port=0, limit=HEAD_LIMIT_BYTES)
            self.address = server.sockets[0].getsockname()[:2]

        self.loop, self.thread = loop_thread_start(start, name="browser-proxy")


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
