"""Session events: numbered, kept for replay, fanned out live.

Every event is a JSON frame ``{seq, type, session_id, run_id, data, ts}``. ``seq`` increases
by one per session. Publishing does two things:

1. one atomic Redis script increments the session's counter and appends the event to the
   session's Redis stream (bounded to :data:`STREAM_MAXLEN` entries, stream id ``<seq>-0``),
   so a client that reconnects with the last ``seq`` it saw can replay what it missed;
2. a send to the Channels group ``session.<id>`` for live delivery, as the channel-layer
   message ``{"type": "session.event", "seq": seq, "body": "<the frame's JSON without seq>"}``.

Live delivery uses the channel layer :data:`EVENTS_LAYER` (``"events"``), which the project
configures as channels_redis's ``RedisPubSubChannelLayer``: a group send is one Redis
``PUBLISH``, and a web process reads every session's events from one pub/sub connection
(its own, :mod:`sessions.live`, when the script fans out itself).
With that layer (one host, the same Redis as ``REDIS_URL``, msgpack, no encryption) the
publish script also does the group send itself, exactly as
``RedisPubSubChannelLayer.group_send`` would (``PUBLISH <prefix>__group__session.<id>`` of
the msgpack message, with Redis's ``cmsgpack``): one round trip per event, and no lock
around the layer's single publishing connection. Any other layer gets the script without
the fan-out, then ``group_send``.

The core channels_redis layer (the project's ``default``, used by the browser bridge) costs
the web process four Redis round trips per message received, one message at a time under a
process-wide lock; at 200 runs streaming at once that queue was most of the token → client
latency (bench/README.md). Pub/sub is at-most-once: a message published while the web
process's subscription is reconnecting is lost. The consumer therefore fills gaps from the
stream when a later ``seq`` arrives, and checks the stream every ``CATCH_UP_SECONDS`` for a
lost last event (sessions/consumers.py).

The channel layer is lossy fan-out, not storage: durable facts (messages, tool calls, run
status) are PostgreSQL rows written *before* their event is published.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
import weakref
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from sessions.event_types import EVENT_TYPES  # noqa: F401 - re-exported: the event type names

STREAM_MAXLEN = 2000
"""Events kept per session for replay (approximate trim)."""
KEY_TTL_SECONDS = 30 * 24 * 3600
"""Idle sessions' counters and streams expire after 30 days."""


_PUBLISH_LUA = """
local seq = redis.call('INCR', KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], tostring(seq) .. '-0', 'e', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if ARGV[4] == '1' then
  -- channels_redis 4.x RedisPubSubChannelLayer.group_send, in the same script
  redis.call('PUBLISH', KEYS[3], cmsgpack.pack({type = 'session.event', seq = seq, body = ARGV[1]}))
end
return seq
"""


EVENTS_LAYER = "events"
"""The Channels layer alias (``CHANNEL_LAYERS``) of session events: the consumers of
``/ws/sessions/<id>/`` join their session's group on it."""

_PUBSUB_BACKEND = "channels_redis.pubsub.RedisPubSubChannelLayer"


def events_layer() -> Any:
    """The channel layer session events are fanned out on (alias :data:`EVENTS_LAYER`)."""
    return get_channel_layer(EVENTS_LAYER)


def group_name(session_id: int) -> str:
    """The Channels group of a session (ASCII, < 100 characters, as Channels requires)."""
    return f"session.{session_id}"


def _keys(session_id: int) -> list[str]:
    prefix = settings.REDIS_KEY_PREFIX
    return [f"{prefix}:session:{session_id}:seq", f"{prefix}:session:{session_id}:events"]


def _pubsub_group_channel(session_id: int) -> str | None:
    """The Redis pub/sub channel the events layer publishes ``session.<id>``'s group sends on,
    if the publish script can do that send itself (see the module docstring), else None."""
    config = settings.CHANNEL_LAYERS.get(EVENTS_LAYER, {})
    options = config.get("CONFIG", {})
    hosts = options.get("hosts") or []
    fans_out = (
        config.get("BACKEND") == _PUBSUB_BACKEND
        and len(hosts) == 1
        and isinstance(hosts[0], dict)
        and hosts[0].get("address") == settings.REDIS_URL
        and options.get("serializer_format", "msgpack") == "msgpack"
        and not options.get("symmetric_encryption_keys")
    )
    if not fans_out:
        return None
    # RedisPubSubLoopLayer._get_group_channel_name (channels_redis 4.x)
    return f"{options.get('prefix', 'asgi')}__group__{group_name(session_id)}"


def _script_args(session_id: int, payload: str, group_channel: str | None) -> tuple[Any, ...]:
    """``numkeys, *keys, *args`` of :data:`_PUBLISH_LUA` for one event (``group_channel``:
    :func:`_pubsub_group_channel`'s, None for no fan-out in the script)."""
    keys = _keys(session_id)
    if group_channel is None:
        return (3, *keys, keys[0], payload, STREAM_MAXLEN, KEY_TTL_SECONDS, "0")
    return (3, *keys, group_channel, payload, STREAM_MAXLEN, KEY_TTL_SECONDS, "1")


def _layer_message(seq: int, payload: str) -> dict[str, Any]:
    return {"type": "session.event", "seq": seq, "body": payload}


def frame_text(seq: int, body_json: str) -> str:
    """The JSON text of the frame ``{"seq": seq, **body}`` from the body's JSON text (what
    ``json.dumps`` of that frame gives, without decoding and encoding the body again)."""
    return f'{{"seq": {seq}, {body_json[1:]}' if body_json != "{}" else f'{{"seq": {seq}}}'


def event_body(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event's frame without ``seq``: ``{type, session_id, run_id, data, ts}`` (``ts``: Unix
    seconds). ``data`` is the payload :mod:`sessions.event_types` describes for ``type``
    (checked in the tests, not here: see conftest.py).

    Raises:
        ValueError: ``type`` is not in :data:`EVENT_TYPES`.
    """
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}")
    return {"type": type, "session_id": session_id, "run_id": run_id, "data": data, "ts": time.time()}


def _prepared(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> tuple[dict[str, Any], str, str | None]:
    """An event's body, its JSON (fails here, at the source, if ``data`` is not
    JSON-serialisable) and :func:`_pubsub_group_channel`'s channel for its session."""
    body = event_body(session_id=session_id, run_id=run_id, type=type, data=data)
    return body, json.dumps(body), _pubsub_group_channel(session_id)


def _frame(seq: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"seq": seq, **body}


# --- sync side (API views, services) ---------------------------------------------------------

_sync_client: redis.Redis | None = None


def _sync_redis() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL)
    return _sync_client


def event_publish_sync(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """Publish now, from synchronous code. Returns the frame (with its ``seq``)."""
    body, payload, group_channel = _prepared(session_id=session_id, run_id=run_id, type=type, data=data)
    seq = int(_sync_redis().eval(_PUBLISH_LUA, *_script_args(session_id, payload, group_channel)))
    if group_channel is None:
        async_to_sync(events_layer().group_send)(group_name(session_id), _layer_message(seq, payload))
    return _frame(seq, body)


def event_publish_on_commit(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> None:
    """Publish once the current transaction commits (nothing if it rolls back)."""
    event_body(session_id=session_id, run_id=run_id, type=type, data=data)  # validate now
    json.dumps(data)
    transaction.on_commit(
        lambda: event_publish_sync(session_id=session_id, run_id=run_id, type=type, data=data)
    )


def events_since_sync(*, session_id: int, after_seq: int, limit: int = STREAM_MAXLEN) -> list[dict[str, Any]]:
    """Frames with ``seq > after_seq`` still in the replay stream, oldest first."""
    rows = _sync_redis().xrange(_keys(session_id)[1], min=f"({after_seq}-0", max="+", count=limit)
    return [_decode(entry_id, fields) for entry_id, fields in rows]


# --- async side (the runner, consumers) ------------------------------------------------------

_async_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis]" = weakref.WeakKeyDictionary()


ASYNC_POOL_MAX_CONNECTIONS = 64
"""Redis connections one event loop holds; past that, publishers wait (up to 10 s) for one."""


def async_redis() -> aioredis.Redis:
    """This event loop's shared Redis client (a blocking pool: many runs, few connections)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=ASYNC_POOL_MAX_CONNECTIONS, timeout=10
        )
        client = aioredis.Redis(connection_pool=pool)
        _async_clients[loop] = client
    return client


PIPELINE_MAX_EVENTS = 256
"""Most publishes one pipelined write carries (:class:`_Publisher`)."""
PUBLISH_REPLY_TIMEOUT_SECONDS = 10.0
"""How long the publisher waits for Redis to answer its oldest unanswered publish before it
gives the connection up (every unanswered publish then fails)."""


class _Publisher:
    """An event loop's publishes, pipelined on one Redis connection, in the order they are made.

    :meth:`publish` queues a run of :data:`_PUBLISH_LUA` synchronously (:meth:`command` any
    other command, see :func:`pipelined_command`); whatever was queued
    during one turn of the event loop is written at the start of the next, in one write
    (``loop.call_soon``), without waiting for the replies to earlier writes. A reader task
    reads the replies in order and resolves each publish's future with its ``seq``. Redis
    runs one connection's commands in the order they arrive, so a publish *made* before
    another gets the lower ``seq``, whether or not it was awaited first.

    Why: a run can then publish its next batch of streamed text while the reply to the
    previous one is still on its way, and a publish costs no task of its own. With 200 runs
    streaming, a busy loop read a reply ~45 ms (median) after the publish started, and text
    that came meanwhile waited for it (bench/README.md). One write per turn of the loop also
    pays the system call once for all the runs that published in it.

    Commands are encoded with ``hiredis.pack_command`` (~0.65 µs for a publish, against ~5.3 µs
    through redis-py's ``pack_commands``; the same bytes) and replies parsed by a
    ``hiredis.Reader`` of the publisher's own, fed straight from the connection's stream: every
    reply one read brought is handed out without awaiting anything, where redis-py's
    ``read_response`` enters a timeout and its parser per reply. Together the loop's CPU per
    event published fell from ~21.7 to ~12.5 µs (bench/publish_overhead.py; bench/README.md,
    session 14). Nothing else uses the connection, so no RESP3 push message comes between the
    replies.

    Errors: a failed connect fails the publishes queued for it; a failed write, or a read that
    fails or waits longer than :data:`PUBLISH_REPLY_TIMEOUT_SECONDS`, fails every unanswered
    publish (their events may or may not have been stored). The connection is dropped then,
    and the next publish opens a new one; so does a publish that finds the connection closed
    by Redis while it was idle, and nothing is lost then. A caller cancelled while it waits only stops
    waiting: its event goes out all the same. No task outlives the work: the connecting task
    ends when connected, the reader when every publish is answered.
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._connection: Any = None  # a redis.asyncio.Connection of this publisher's own
        self._connecting: asyncio.Task[None] | None = None
        self._queued: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []  # (command, its future)
        self._write_scheduled = False
        self._unanswered: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._reading: Any = None  # the connection self._reader reads
        self._replies: Any = None  # the hiredis.Reader of self._connection's replies (one per connection)

    def publish(self, script_args: tuple[Any, ...]) -> "asyncio.Future[int]":
        """Queue one run of :data:`_PUBLISH_LUA`; the future gets its ``seq`` (or its error)."""
        return self.command(("EVAL", _PUBLISH_LUA, *script_args))

    def command(self, args: tuple[Any, ...]) -> "asyncio.Future[Any]":
        """Queue one Redis command (``("EVAL", script, numkeys, …)``); the future gets its
        reply as the connection's parser gives it (or its error)."""
        future: asyncio.Future[Any] = self._loop.create_future()
        self._queued.append((args, future))
        if not self._write_scheduled:
            self._write_scheduled = True
            self._loop.call_soon(self._write)
        return future

    def _write(self) -> None:
        self._write_scheduled = False
        if not self._queued:
            return
        connection = self._connection
        writer = _open_writer(connection)
        if writer is None and connection is not None:  # closed while idle (Redis restarted, CLIENT KILL)
            self._drop(connection, redis.ConnectionError("the publisher's Redis connection was closed"))
        if writer is None:
            if self._connecting is None or self._connecting.done():
                self._connecting = asyncio.ensure_future(self._connect())
            return  # written once connected
        batch, self._queued = self._queued, []
        self._unanswered.extend(future for _, future in batch)
        if self._reader is None or self._reader.done() or self._reading is not connection:
            self._reading = connection  # (a reader of a dropped connection is on its way out)
            self._reader = asyncio.ensure_future(self._read(connection, self._replies))
        try:
            pack = hiredis.pack_command
            for start in range(0, len(batch), PIPELINE_MAX_EVENTS):
                writer.write(b"".join([pack(args) for args, _ in batch[start:start + PIPELINE_MAX_EVENTS]]))
        except Exception as exc:  # noqa: BLE001 - a closed transport, a bad argument (TypeError)
            self._drop(connection, exc)

    async def _connect(self) -> None:
        connection = self._client.connection_pool.make_connection()
        # The handshake's reads wait at most this long (then redis.TimeoutError), as _read's do.
        connection.socket_timeout = PUBLISH_REPLY_TIMEOUT_SECONDS
        try:
            await connection.connect()
        except BaseException as exc:
            queued, self._queued = self._queued, []
            _fail([future for _, future in queued], exc)
            if not isinstance(exc, Exception):
                raise
            return
        if _open_writer(connection) is None:  # a redis-py without the stream attributes used here
            await connection.disconnect()
            raise RuntimeError("redis.asyncio.Connection has no _reader/_writer streams: update _open_writer")
        self._connection, self._replies = connection, _reply_parser()
        self._write()

    async def _read(self, connection: Any, replies: Any) -> None:
        """Resolve the unanswered publishes, in order, from ``connection``'s replies (parsed by
        ``replies``, a ``hiredis.Reader``); ends when none is left or the connection is dropped."""
        stream: asyncio.StreamReader = connection._reader  # noqa: SLF001 - see _open_writer
        unanswered = self._unanswered
        try:
            while unanswered and connection is self._connection:
                reply = replies.gets()
                if reply is _NOT_ENOUGH_DATA:  # not a whole reply buffered: read what Redis has sent
                    try:
                        async with asyncio.timeout(PUBLISH_REPLY_TIMEOUT_SECONDS):
                            data = await stream.read(_REPLY_READ_BYTES)
                    except TimeoutError:
                        raise redis.TimeoutError(
                            f"Redis did not answer a publish within {PUBLISH_REPLY_TIMEOUT_SECONDS:g} s"
                        ) from None
                    if not data:
                        raise redis.ConnectionError("Redis closed the publisher's connection")
                    replies.feed(data)
                    continue
                future = unanswered.popleft()
                if isinstance(reply, redis.ResponseError):  # this command failed; the connection is fine
                    _fail([future], reply)
                elif not future.done():  # else its caller stopped waiting; the event went out all the same
                    future.set_result(reply)
        except BaseException as exc:  # noqa: BLE001 - a failed read, a protocol error, a cancel
            self._drop(connection, exc)
            if not isinstance(exc, Exception):
                raise

    def _drop(self, connection: Any, exc: BaseException) -> None:
        """Give ``connection`` up after ``exc``: its unanswered publishes fail with it."""
        if connection is not self._connection:
            return  # already dropped
        self._connection = None
        unanswered = list(self._unanswered)
        self._unanswered.clear()
        _fail(unanswered, exc)
        writer = getattr(connection, "_writer", None)
        if writer is not None:
            writer.close()  # redis-py notices at its next use; nothing else holds this connection

    async def aclose(self) -> None:
        """Wait until every queued publish is answered (or failed), then close the connection."""
        while self._queued or self._unanswered or (self._connecting is not None and not self._connecting.done()):
            pending = [t for t in (self._connecting, self._reader) if t is not None and not t.done()]
            if pending:
                await asyncio.wait(pending)
            else:
                await asyncio.sleep(0)  # a write is scheduled
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.disconnect()


_NOT_ENOUGH_DATA = object()
_REPLY_READ_BYTES = 65536
"""Most bytes the publisher (a publish's reply is ~5 bytes) and the web process's live
subscription (sessions/live.py) read from Redis at once."""


def _reply_parser() -> Any:
    """A ``hiredis.Reader`` for the publisher's replies (and sessions/live.py's): bytes as Redis sent them (no decoding,
    as ``pipelined_command`` promises), a Redis error as a ``redis.ResponseError`` value, a
    malformed reply raised as ``redis.InvalidResponse``; the connection speaks RESP2 or RESP3,
    whichever redis-py's handshake chose."""
    return hiredis.Reader(protocolError=redis.InvalidResponse, replyError=redis.ResponseError,
                          notEnoughData=_NOT_ENOUGH_DATA)  # (False is a RESP3 reply)


def _open_writer(connection: Any) -> asyncio.StreamWriter | None:
    """The StreamWriter of a redis-py asyncio connection that is open for a pipelined write,
    else None (none yet, or the peer closed it). redis-py has no public call that writes
    without awaiting the write, hence its ``_reader``/``_writer`` streams (pinned by
    sessions/tests/test_events_fanout.py)."""
    reader, writer = getattr(connection, "_reader", None), getattr(connection, "_writer", None)
    if reader is None or writer is None or writer.is_closing() or reader.at_eof():
        return None
    return writer


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.cancel() if isinstance(exc, asyncio.CancelledError) else future.set_exception(exc)


_publishers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Publisher]" = weakref.WeakKeyDictionary()


def _publisher() -> _Publisher:
    loop = asyncio.get_running_loop()
    publisher = _publishers.get(loop)
    if publisher is None:
        publisher = _publishers[loop] = _Publisher(async_redis())
    return publisher


def pipelined_command(*args: Any) -> "asyncio.Future[Any]":
    """Send one Redis command on this event loop's publishing connection (:class:`_Publisher`),
    pipelined with the loop's event publishes and other such commands, in call order.

    For small, frequent commands of the runs (the route-entry health scripts,
    ``llm.health.RedisEntryHealth``): a ``redis.asyncio`` call costs the loop ~230–390 µs of
    CPU on the benchmark machine (connection pool, retries, per-call parsing), a pipelined
    one 60–160 µs (bench/README.md).

    Returns:
        A future of the reply as redis-py's parser gives it (bytes, int, lists, None for nil;
        no response callbacks, no decoding).

    Raises (through the future):
        redis.ResponseError: the command failed (the connection stays).
        redis.ConnectionError, redis.TimeoutError: the connection failed or Redis did not
            answer within :data:`PUBLISH_REPLY_TIMEOUT_SECONDS`.
    """
    return _publisher().command(args)


async def publisher_aclose() -> None:
    """Close this event loop's publisher once its queued publishes are answered (run host
    shutdown); a later publish opens a new one."""
    publisher = _publishers.pop(asyncio.get_running_loop(), None)
    if publisher is not None:
        await publisher.aclose()


async def event_publish(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """Publish now, from async code (pipelined with the loop's other publishes, see
    :class:`_Publisher`). Returns the frame (with its ``seq``).

    The event is queued before this coroutine first suspends, so of two publishes of a
    session the one whose coroutine started first gets the lower ``seq``.

    Raises:
        redis.RedisError: the round trip failed (the event may or may not have been stored).
    """
    body, payload, group_channel = _prepared(session_id=session_id, run_id=run_id, type=type, data=data)
    seq = await _publisher().publish(_script_args(session_id, payload, group_channel))
    if group_channel is None:
        await events_layer().group_send(group_name(session_id), _layer_message(seq, payload))
    return _frame(seq, body)


def event_publish_nowait(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> "asyncio.Future[Any]":
    """:func:`event_publish` without waiting, from the event loop: the event is queued now, so
    it gets a lower ``seq`` than any publish made after this call. The returned future is done
    when the event is stored and sent (its result is then of no use) or holds the error.
    """
    _, payload, group_channel = _prepared(session_id=session_id, run_id=run_id, type=type, data=data)
    seq = _publisher().publish(_script_args(session_id, payload, group_channel))
    if group_channel is not None:
        return seq
    return asyncio.ensure_future(_group_send_after(seq, session_id, payload))


async def _group_send_after(seq: "asyncio.Future[int]", session_id: int, payload: str) -> None:
    await events_layer().group_send(group_name(session_id), _layer_message(await seq, payload))


async def events_since(*, session_id: int, after_seq: int, limit: int = STREAM_MAXLEN) -> list[dict[str, Any]]:
    """Async :func:`events_since_sync`."""
    rows = await async_redis().xrange(_keys(session_id)[1], min=f"({after_seq}-0", max="+", count=limit)
    return [_decode(entry_id, fields) for entry_id, fields in rows]


def _decode(entry_id: bytes | str, fields: dict[bytes, bytes]) -> dict[str, Any]:
    raw_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    seq = int(raw_id.split("-", 1)[0])
    return _frame(seq, json.loads(fields[b"e"]))


async def events_follow(*, session_id: int, after_seq: int, block_seconds: float):
    """Frames with ``seq > after_seq`` from the replay stream, then live ones, in order.

    Reads the Redis stream itself (``XREAD BLOCK``), so order and completeness come from one
    place; yields None when nothing arrived within ``block_seconds`` (the caller sends a
    keepalive). Ends when the caller stops iterating.
    """
    client = async_redis()
    key = _keys(session_id)[1]
    last_id = f"{after_seq}-0"
    while True:
        rows = await client.xread({key: last_id}, count=500, block=int(block_seconds * 1000))
        if not rows:
            yield None
            continue
        for entry_id, fields in rows[0][1]:
            frame = _decode(entry_id, fields)
            last_id = f"{frame['seq']}-0"
            yield frame
