"""The Redis clients in one module (agent_platform/redis_clients.py): the URL forms its own
connections honour (host, port, db, password, TLS, unix socket, RESP3), the handshake they do
themselves, and that the event path uses no private name of redis-py, channels_redis or
another module of ours."""

from __future__ import annotations

import ast
import asyncio
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

from agent_platform.redis_clients import RedisAddress, redis_address, redis_stream_open

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
EVENT_PATH = [
    "agent_platform/redis_clients.py", "sessions/events.py", "sessions/live.py", "sessions/consumers.py",
    "sessions/sse.py", "sessions/stream_guard.py", "sessions/runner/cancellation.py", "browser/bridge.py",
    "browser/services.py", "browser/consumers.py",
]


def test_redis_address_reads_every_url_form() -> None:
    assert redis_address("redis://127.0.0.1:6379/0") == RedisAddress()
    assert redis_address("redis://:s%40cret@redis.internal:6380/4") == RedisAddress(
        host="redis.internal", port=6380, db=4, password="s@cret")
    assert redis_address("redis://app:pw@h/2?protocol=3") == RedisAddress(
        host="h", db=2, username="app", password="pw", protocol=3)
    assert redis_address("rediss://h:6390/1?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem") == RedisAddress(
        host="h", port=6390, db=1, tls=True, tls_verify=False, tls_ca_file="/etc/ca.pem")
    assert redis_address("unix://:pw@/run/redis.sock?db=3") == RedisAddress(path="/run/redis.sock", db=3, password="pw")
    for bad in ("http://h/0", "redis://h/x", "redis://h/0?protocol=4"):
        with pytest.raises(ValueError):
            redis_address(bad)


async def _recording_redis(replies: dict[bytes, bytes]) -> tuple[asyncio.Server, list[list[bytes]]]:
    """A stand-in Redis that records each command and answers by command name (``+OK`` if unlisted)."""
    seen: list[list[bytes]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            if line.startswith(b"*"):
                parts = [(await reader.readline(), await reader.readline())[1].strip() for _ in range(int(line[1:]))]
                seen.append(parts)
                writer.write(replies.get(parts[0].upper(), b"+OK\r\n"))

    return await asyncio.start_server(serve, "127.0.0.1", 0), seen


async def test_the_handshake_authenticates_selects_and_negotiates_as_the_url_says() -> None:
    server, seen = await _recording_redis({b"HELLO": b"%1\r\n+server\r\n+redis\r\n"})
    port = server.sockets[0].getsockname()[1]
    try:
        for url, expected in [
            (f"redis://127.0.0.1:{port}/0", []),
            (f"redis://:p%40ss@127.0.0.1:{port}/5", [[b"AUTH", b"p@ss"], [b"SELECT", b"5"]]),
            (f"redis://app:pw@127.0.0.1:{port}/0", [[b"AUTH", b"app", b"pw"]]),
            (f"redis://app:pw@127.0.0.1:{port}/2?protocol=3", [[b"HELLO", b"3", b"AUTH", b"app", b"pw"], [b"SELECT", b"2"]]),
        ]:
            seen.clear()
            reader, writer = await redis_stream_open(url=url)
            writer.close()
            assert seen == expected, url
    finally:
        server.close()


async def test_a_refused_password_is_an_authentication_error_and_a_dead_port_a_connection_error() -> None:
    server, _ = await _recording_redis({b"AUTH": b"-WRONGPASS invalid username-password pair\r\n"})
    try:
        with pytest.raises(redis.AuthenticationError):
            await redis_stream_open(url=f"redis://:nope@127.0.0.1:{server.sockets[0].getsockname()[1]}/0")
    finally:
        server.close()
    with pytest.raises(redis.ConnectionError):
        await redis_stream_open(url="redis://127.0.0.1:9/0")


async def test_the_publisher_and_the_live_subscription_use_the_url_s_database() -> None:
    """Events published through a REDIS_URL naming db 3 land in db 3 (the publisher's SELECT)."""
    from sessions import events

    session_id = 10**9 + uuid.uuid4().int % 10**9
    url = redis_address(settings.REDIS_URL)
    other_db = f"redis://{url.host}:{url.port}/3"
    publisher = events._Publisher(other_db)
    try:
        assert await publisher.publish(events._script_args(session_id, '{"type": "run_running"}')) == 1
    finally:
        await publisher.aclose()
    db3 = redis.Redis.from_url(other_db)
    try:
        key = events.session_keys(session_id)[1]
        assert db3.xlen(key) == 1 and not redis.Redis.from_url(settings.REDIS_URL).exists(key)
        db3.delete(*events.session_keys(session_id))
    finally:
        db3.close()


def _private_uses(path: Path) -> list[str]:
    """Imports of another module's ``_private`` names, and ``x._attr`` reads of objects other
    than ``self``/``cls`` (a third-party object's internals, another module's privates)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__group__" in node.value:
            found.append(f"line {node.lineno}: channels_redis's private group naming")
    return found


def test_the_event_path_uses_no_private_name_of_another_module_or_library() -> None:
    offenders = {name: uses for name in EVENT_PATH if (uses := _private_uses(ROOT / name))}
    assert offenders == {}


def test_more_threads_than_the_sync_pool_holds_wait_for_a_connection_instead_of_failing(monkeypatch) -> None:
    """Past redis-py's default of 100 connections a ``ConnectionPool`` raises
    ``MaxConnectionsError``: 200 chat completions starting at once made 53 of them a 500 (each
    start publishes its message's event with :func:`sync_redis`). The process's pool blocks
    instead: 150 threads each holding a connection for 0.3 s all get their answer."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from agent_platform import redis_clients

    monkeypatch.setattr(redis_clients, "_sync_client", None)  # the pool as the settings make it
    client = redis_clients.sync_redis()
    key = f"{settings.REDIS_KEY_PREFIX}:test:empty:{uuid.uuid4().hex}"
    start = threading.Barrier(150)

    def hold(_: int) -> str:
        start.wait(timeout=10)
        try:
            client.blpop([key], timeout=0.3)  # holds its connection for 0.3 s
        except redis.exceptions.RedisError as exc:
            return type(exc).__name__
        return "ok"

    try:
        with ThreadPoolExecutor(150) as pool:
            outcomes = list(pool.map(hold, range(150)))
    finally:
        client.close()
    assert outcomes == ["ok"] * 150
    assert client.connection_pool.max_connections == redis_clients.SYNC_POOL_MAX_CONNECTIONS < 150
