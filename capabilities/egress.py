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
  check, then **one request per client connection**: the request goes to the checked address
  in origin form with ``Connection: close`` (its body by ``Content-Length``; a chunked request
  body is refused with 411), the answer to the program says ``Connection: close`` too and ends
  after the declared body. A kept-alive connection therefore never carries a second request
  (for another host, with that host's cookies) to the first server unchecked: the program
  opens a new connection and that one is checked. ``Proxy-*`` and other hop-by-hop headers
  are dropped.

The connection handling is :mod:`capabilities.checked_proxy`'s (shared with the server
browser's proxy); this module adds the egress rules and the Unix socket. Anything else, a
refused address, a name that does not resolve or a server that cannot be reached is answered
with an HTTP error (403, 400, 411 or 502) whose text (and ``X-Agent-Platform-Refused`` header)
says why, so the program (and through it the model) reads a reason instead of a hang. Networks listed in
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
import functools
import ipaddress
import logging
import os
import shutil
import tempfile
import threading
from typing import Any

from capabilities.checked_proxy import HEAD_LIMIT_BYTES, ProxyRefused, loop_thread_start, serve_connection
from capabilities.netsafe import FetchError, resolve_host

logger = logging.getLogger(__name__)


class EgressRefused(ProxyRefused):
    """A destination the egress rules refuse; ``status`` is the HTTP status answered."""


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


_handle = functools.partial(serve_connection, check=egress_check, logger=logger, label="egress")
"""One client connection: :func:`capabilities.checked_proxy.serve_connection` with the egress check."""


class _Proxy:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="ap-egress-")
        os.chmod(self.directory, 0o755)
        self.path = os.path.join(self.directory, "egress.sock")

        async def start() -> None:
            await asyncio.start_unix_server(_handle, path=self.path, limit=HEAD_LIMIT_BYTES)
            os.chmod(self.path, 0o666)

        self.loop, self.thread = loop_thread_start(start, name="egress-proxy")
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
