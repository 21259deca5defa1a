"""The project's Redis clients, in one place (all of them reach ``settings.REDIS_URL``).

- :func:`sync_redis`: the process's synchronous ``redis.Redis`` over a blocking pool of at most
  :data:`SYNC_POOL_MAX_CONNECTIONS` connections (API views, services, the browser bridge's
  presence reads, cancellation's publish).
- :func:`async_redis`: the running event loop's ``redis.asyncio.Redis`` over a blocking pool
  of at most :data:`ASYNC_POOL_MAX_CONNECTIONS` connections.
- :func:`async_redis_dedicated`: an asyncio client of the caller's own (a long-lived pub/sub
  listener: the cancel hub).
- :func:`redis_stream_open`: a connection of the caller's own as plain asyncio streams, with
  the handshake (AUTH, SELECT, HELLO) done, for code that pipelines commands itself and
  parses replies with a ``hiredis.Reader`` (:func:`reply_reader`): the event publisher
  (:mod:`sessions.events`) and the web process's live subscription (:mod:`sessions.live`).
  They use redis-py's clients for nothing, so no private attribute of redis-py is needed.

``REDIS_URL`` forms honoured by :func:`redis_stream_open` (as redis-py reads them):
``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS, verified against the
system's CA store unless ``ssl_cert_reqs=none``; ``ssl_ca_certs=<path>`` adds a CA file),
``unix://[[user]:password@]/path/to/socket[?db=N]``; ``?db=N`` and ``?protocol=3`` (RESP3, via
``HELLO 3``) in the query.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import weakref
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
import redis
import redis.asyncio as aioredis
from django.conf import settings

ASYNC_POOL_MAX_CONNECTIONS: Final[int] = 64
"""Redis connections one event loop's :func:`async_redis` holds; past that, callers wait (up to 10 s) for one."""
SYNC_POOL_MAX_CONNECTIONS: Final[int] = 64
"""Redis connections the process's :func:`sync_redis` holds; past that, threads wait (up to
10 s) for one. redis-py's own ``ConnectionPool`` raises ``MaxConnectionsError`` past 100
instead: 200 chat completions starting at once in one web process (a thread each) made 53 of
them a 500."""
READ_BYTES: Final[int] = 65536
"""Most bytes the publisher and the live subscription read from their stream at once."""
NOT_ENOUGH_DATA: Final[object] = object()
"""What :func:`reply_reader`'s ``gets()`` returns while no whole reply is buffered (``False``
is a RESP3 reply, so the reader's default is not usable)."""

_sync_client: redis.Redis | None = None
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()


def sync_redis() -> redis.Redis:
    """The process's synchronous Redis client (thread-safe: a blocking pool of at most
    :data:`SYNC_POOL_MAX_CONNECTIONS` connections; a thread waits up to 10 s for one, then
    ``redis.ConnectionError``)."""
    global _sync_client
    if _sync_client is None:
        pool = redis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=SYNC_POOL_MAX_CONNECTIONS,
                                                     timeout=10)
        _sync_client = redis.Redis(connection_pool=pool)
    return _sync_client


def async_redis() -> aioredis.Redis:
    """The running event loop's shared asyncio Redis client (a blocking pool: many callers,
    few connections). Must be called on a running event loop (else ``RuntimeError``)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=ASYNC_POOL_MAX_CONNECTIONS, timeout=10
        )
        client = aioredis.Redis(connection_pool=pool)
        _async_clients[loop] = client
    return client


def async_redis_dedicated(*, client_name: str) -> aioredis.Redis:
    """A new asyncio Redis client of the caller's own (its own pool), named ``client_name`` in
    ``CLIENT LIST``: for a long-lived pub/sub listener that must not hold a shared pool's
    connection (the run host's cancel hub). The caller closes it (``aclose()``)."""
    return aioredis.Redis.from_url(settings.REDIS_URL, client_name=client_name)


def reply_reader() -> hiredis.Reader:
    """A ``hiredis.Reader`` for replies read from a :func:`redis_stream_open` stream: bytes as
    Redis sent them (no decoding), a Redis error as a ``redis.ResponseError`` *value*, a
    malformed reply raised as ``redis.InvalidResponse``, :data:`NOT_ENOUGH_DATA` while no
    whole reply is buffered."""
    return hiredis.Reader(protocolError=redis.InvalidResponse, replyError=redis.ResponseError,
                          notEnoughData=NOT_ENOUGH_DATA)


@dataclasses.dataclass(frozen=True)
class RedisAddress:
    """Where and how to reach Redis, read from a URL by :func:`redis_address`."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    """A unix socket's path (then host and port are unused)."""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_verify: bool = True
    tls_ca_file: str | None = None
    protocol: int = 2
    """2 (RESP2) or 3 (RESP3, negotiated with ``HELLO 3``)."""


def redis_address(url: str) -> RedisAddress:
    """Parse a Redis URL (the forms in the module docstring).

    Raises:
        ValueError: an unsupported scheme, or a ``db`` / ``protocol`` / port that is not a number.
    """
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    protocol = int(query.get("protocol", 2))
    if protocol not in (2, 3):
        raise ValueError(f"unsupported Redis protocol {protocol!r} in REDIS_URL")
    if parts.scheme == "unix":
        return RedisAddress(path=unquote(parts.path), db=int(query.get("db", 0)), username=username,
                            password=password, protocol=protocol)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r}")
    db_text = parts.path.lstrip("/") or query.get("db", "0")
    return RedisAddress(
        host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=int(db_text), username=username,
        password=password, tls=parts.scheme == "rediss",
        tls_verify=query.get("ssl_cert_reqs", "required").lower() not in ("none", "cert_none"),
        tls_ca_file=query.get("ssl_ca_certs"), protocol=protocol,
    )


def _tls_context(address: RedisAddress) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=address.tls_ca_file)
    if not address.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def redis_stream_open(
    *, url: str | None = None, timeout_seconds: float = 10.0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a connection of the caller's own to Redis and do its handshake.

    The handshake is pipelined (one write): ``HELLO 3 [AUTH user password]`` for
    ``protocol=3``, else ``AUTH [user] password`` if the URL has a password; ``SELECT db`` if
    ``db`` is not 0. Replies after it are read by the caller (with :func:`reply_reader`).

    Args:
        url: A Redis URL; ``settings.REDIS_URL`` by default.
        timeout_seconds: Connect and handshake together take at most this long.

    Returns:
        ``(reader, writer)``: asyncio streams of the connection, ready for commands.

    Raises:
        redis.ConnectionError: Redis could not be reached, or closed the connection.
        redis.TimeoutError: no connection or handshake within ``timeout_seconds``.
        redis.AuthenticationError: Redis refused the credentials.
        redis.ResponseError: Redis refused another handshake command (``SELECT`` of a bad db).
        ValueError: a malformed URL (see :func:`redis_address`).
    """
    address = redis_address(url or settings.REDIS_URL)
    handshake: list[tuple[Any, ...]] = []
    if address.protocol == 3:
        auth = ("AUTH", address.username or "default", address.password) if address.password is not None else ()
        handshake.append(("HELLO", 3, *auth))
    elif address.password is not None:
        handshake.append(("AUTH", *((address.username,) if address.username else ()), address.password))
    if address.db:
        handshake.append(("SELECT", address.db))
    try:
        async with asyncio.timeout(timeout_seconds):
            if address.path is not None:
                reader, writer = await asyncio.open_unix_connection(address.path, limit=READ_BYTES)
            else:
                reader, writer = await asyncio.open_connection(
                    address.host, address.port, limit=READ_BYTES,
                    ssl=_tls_context(address) if address.tls else None,
                    server_hostname=address.host if address.tls else None,
                )
            try:
                if handshake:
                    writer.write(b"".join(hiredis.pack_command(c) for c in handshake))
                    await _handshake_replies(reader, len(handshake))
            except BaseException:
                writer.close()
                raise
    except TimeoutError:
        raise redis.TimeoutError(f"Redis did not accept a connection within {timeout_seconds:g} s") from None
    except OSError as exc:
        raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
    return reader, writer


async def _handshake_replies(reader: asyncio.StreamReader, count: int) -> None:
    replies = reply_reader()
    while count:
        reply = replies.gets()
        if reply is NOT_ENOUGH_DATA:
            data = await reader.read(READ_BYTES)
            if not data:
                raise redis.ConnectionError("Redis closed the connection during the handshake")
            replies.feed(data)
            continue
        count -= 1
        if isinstance(reply, redis.ResponseError):
            text = str(reply)
            if text.startswith(("WRONGPASS", "NOAUTH", "NOPERM")) or "invalid password" in text.lower():
                raise redis.AuthenticationError(text)
            raise reply
