"""Session events: numbered, kept for replay, fanned out live.

Every event is a JSON frame ``{seq, type, session_id, run_id, data, ts}``. ``seq`` increases
by one per session; ``data`` has the shape :mod:`sessions.event_types` gives its type.
Publishing is one atomic Redis script (:data:`_PUBLISH_LUA`), one round trip per event, that

1. increments the session's counter and appends the event to the session's Redis stream
   (bounded to :data:`STREAM_MAXLEN` entries, stream id ``<seq>-0``), so a client that
   reconnects with the last ``seq`` it saw can replay what it missed;
2. ``PUBLISH``-es it on the session's live channel (:func:`live_channel`, a name of ours) as
   the msgpack of ``{"type": "session.event", "seq": seq, "body": "<the frame's JSON without
   seq>"}``. Web processes read every session's live events from one subscription each
   (:mod:`sessions.live`), which the WebSocket consumers and SSE streams join.

Pub/sub is at-most-once: a message published while a web process's subscription is
reconnecting is lost. The reader every transport shares (:mod:`sessions.event_reader`: the
WebSocket consumer, the SSE view) therefore fills gaps from the stream when a later ``seq``
arrives, and checks the stream every ``CATCH_UP_SECONDS`` for a lost last event.

Durable facts (messages, tool calls, run status) are PostgreSQL rows written *before* their
event is published: events are notifications, not storage.

From async code the loop's publishes are pipelined on one connection of the publisher's own
(:class:`_Publisher`: asyncio streams opened by :func:`agent_platform.redis_clients.redis_stream_open`,
commands packed and replies parsed with hiredis's public API); from sync code, through
:func:`agent_platform.redis_clients.sync_redis`.
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
from django.conf import settings
from django.db import transaction

from agent_platform.redis_clients import (
    NOT_ENOUGH_DATA,
    READ_BYTES,
    async_redis,  # noqa: F401 - also re-exported (the runner's import)
    redis_stream_open,
    reply_reader,
    sync_redis,
)
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
redis.call('PUBLISH', KEYS[3], cmsgpack.pack({type = 'session.event', seq = seq, body = ARGV[1]}))
return seq
"""
"""KEYS: the session's counter, stream and live channel; ARGV: the frame's JSON without
``seq``, :data:`STREAM_MAXLEN`, :data:`KEY_TTL_SECONDS`. Returns the event's ``seq``."""


def live_channel(session_id: int) -> str:
    """The Redis pub/sub channel a session's events are published on for live delivery
    (:mod:`sessions.live` subscribes to it): ``<REDIS_KEY_PREFIX>:session:<id>:live``."""
    return f"{settings.REDIS_KEY_PREFIX}:session:{session_id}:live"


def session_keys(session_id: int) -> list[str]:
    """``[seq counter key, event stream key]`` of a session in Redis (under REDIS_KEY_PREFIX)."""
    prefix = settings.REDIS_KEY_PREFIX
    return [f"{prefix}:session:{session_id}:seq", f"{prefix}:session:{session_id}:events"]


def _script_args(session_id: int, payload: str) -> tuple[Any, ...]:
    """``numkeys, *keys, *args`` of :data:`_PUBLISH_LUA` for one event (``payload``: the
    frame's JSON without ``seq``)."""
    return (3, *session_keys(session_id), live_channel(session_id), payload, STREAM_MAXLEN, KEY_TTL_SECONDS)


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


def _prepared(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """An event's body and its JSON (fails here, at the source, if ``data`` is not
    JSON-serialisable)."""
    body = event_body(session_id=session_id, run_id=run_id, type=type, data=data)
    return body, json.dumps(body)


def _frame(seq: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"seq": seq, **body}


# --- sync side (API views, services) ---------------------------------------------------------


def event_publish_sync(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """Publish now, from synchronous code. Returns the frame (with its ``seq``).

    Raises:
        ValueError: an unknown event type. TypeError: ``data`` is not JSON-serialisable.
        redis.RedisError: the round trip failed (the event may or may not have been stored).
    """
    body, payload = _prepared(session_id=session_id, run_id=run_id, type=type, data=data)
    seq = int(sync_redis().eval(_PUBLISH_LUA, *_script_args(session_id, payload)))
    return _frame(seq, body)


def session_seq_sync(session_id: int) -> int:
    """The ``seq`` of the session's last published event (0: none yet): a reader opened with
    ``after_seq`` set to it sees only what is published from now on."""
    return int(sync_redis().get(session_keys(session_id)[0]) or 0)


def event_publish_on_commit(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> None:
    """Publish once the current transaction commits (nothing if it rolls back). The type and
    the JSON-serialisability of ``data`` are checked now (ValueError, TypeError)."""
    event_body(session_id=session_id, run_id=run_id, type=type, data=data)  # validate now
    json.dumps(data)
    transaction.on_commit(
        lambda: event_publish_sync(session_id=session_id, run_id=run_id, type=type, data=data)
    )


def events_since_sync(*, session_id: int, after_seq: int, limit: int = STREAM_MAXLEN) -> list[dict[str, Any]]:
    """Frames with ``seq > after_seq`` still in the replay stream, oldest first."""
    rows = sync_redis().xrange(session_keys(session_id)[1], min=f"({after_seq}-0", max="+", count=limit)
    return [_decode(entry_id, fields) for entry_id, fields in rows]


# --- async side (the runner, consumers) ------------------------------------------------------

PIPELINE_MAX_EVENTS = 256
"""Most publishes one pipelined write carries (:class:`_Publisher`)."""
PUBLISH_REPLY_TIMEOUT_SECONDS = 10.0
"""How long the publisher waits for Redis to answer its oldest unanswered publish (and for a
new connection and its handshake) before it gives the connection up (every unanswered publish
then fails)."""


class _Connection:
    """One connection of a :class:`_Publisher`: its asyncio streams and the hiredis reader of
    its replies (a reader per connection: a dropped connection's half-read reply stays there)."""

    __slots__ = ("reader", "writer", "replies")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.replies = reader, writer, reply_reader()

    def is_open(self) -> bool:
        """False once either side closed it (Redis restarted, ``CLIENT KILL``, a drop of ours)."""
        return not self.writer.is_closing() and not self.reader.at_eof()


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

    The connection is the publisher's own asyncio streams
    (:func:`agent_platform.redis_clients.redis_stream_open`: ``REDIS_URL``'s host or unix
    socket, TLS, AUTH, SELECT, HELLO). Commands are encoded with ``hiredis.pack_command``
    (~0.65 µs for a publish, against ~5.3 µs through redis-py's ``pack_commands``; the same
    bytes) and replies parsed by a ``hiredis.Reader`` fed straight from the stream: every reply
    one read brought is handed out without awaiting anything. The loop's CPU per event
    published: ~12.5 µs against ~21.7 µs through redis-py (bench/publish_overhead.py;
    bench/README.md, session 14). Nothing else uses the connection, so no RESP3 push message
    comes between the replies.

    Errors: a failed connect fails the publishes queued for it; a failed write, or a read that
    fails or waits longer than :data:`PUBLISH_REPLY_TIMEOUT_SECONDS`, fails every unanswered
    publish (their events may or may not have been stored). The connection is dropped then,
    and the next publish opens a new one; so does a publish that finds the connection closed
    by Redis while it was idle, and nothing is lost then. A caller cancelled while it waits
    only stops waiting: its event goes out all the same. No task outlives the work: the
    connecting task ends when connected, the reader when every publish is answered.

    Args:
        url: The Redis URL; ``settings.REDIS_URL`` by default.
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._loop = asyncio.get_running_loop()
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._queued: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []  # (command, its future)
        self._write_scheduled = False
        self._unanswered: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._reading: _Connection | None = None  # the connection self._reader reads

    def publish(self, script_args: tuple[Any, ...]) -> asyncio.Future[int]:
        """Queue one run of :data:`_PUBLISH_LUA`; the future gets its ``seq`` (or its error)."""
        return self.command(("EVAL", _PUBLISH_LUA, *script_args))

    def command(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Queue one Redis command (``("EVAL", script, numkeys, …)``); the future gets its
        reply as hiredis parses it (or its error)."""
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
        if connection is not None and not connection.is_open():  # closed while idle (Redis restarted, CLIENT KILL)
            self._drop(connection, redis.ConnectionError("the publisher's Redis connection was closed"))
            connection = None
        if connection is None:
            if self._connecting is None or self._connecting.done():
                self._connecting = asyncio.ensure_future(self._connect())
            return  # written once connected
        batch, self._queued = self._queued, []
        self._unanswered.extend(future for _, future in batch)
        if self._reader is None or self._reader.done() or self._reading is not connection:
            self._reading = connection  # (a reader of a dropped connection is on its way out)
            self._reader = asyncio.ensure_future(self._read(connection))
        try:
            pack, write = hiredis.pack_command, connection.writer.write
            for start in range(0, len(batch), PIPELINE_MAX_EVENTS):
                write(b"".join([pack(args) for args, _ in batch[start:start + PIPELINE_MAX_EVENTS]]))
        except Exception as exc:  # noqa: BLE001 - a closed transport, a bad argument (TypeError)
            self._drop(connection, exc)

    async def _connect(self) -> None:
        try:
            reader, writer = await redis_stream_open(url=self._url, timeout_seconds=PUBLISH_REPLY_TIMEOUT_SECONDS)
        except BaseException as exc:
            queued, self._queued = self._queued, []
            _fail([future for _, future in queued], exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._connection = _Connection(reader, writer)
        self._write()

    async def _read(self, connection: _Connection) -> None:
        """Resolve the unanswered publishes, in order, from ``connection``'s replies; ends when
        none is left or the connection is dropped."""
        stream, replies = connection.reader, connection.replies
        unanswered = self._unanswered
        try:
            while unanswered and connection is self._connection:
                reply = replies.gets()
                if reply is NOT_ENOUGH_DATA:  # not a whole reply buffered: read what Redis has sent
                    try:
                        async with asyncio.timeout(PUBLISH_REPLY_TIMEOUT_SECONDS):
                            data = await stream.read(READ_BYTES)
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

    def _drop(self, connection: _Connection, exc: BaseException) -> None:
        """Give ``connection`` up after ``exc``: its unanswered publishes fail with it."""
        if connection is not self._connection:
            return  # already dropped
        self._connection = None
        unanswered = list(self._unanswered)
        self._unanswered.clear()
        _fail(unanswered, exc)
        connection.writer.close()

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
            connection.writer.close()
            try:
                await connection.writer.wait_closed()
            except OSError:  # already reset by Redis: closed all the same
                pass


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.cancel() if isinstance(exc, asyncio.CancelledError) else future.set_exception(exc)


_publishers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Publisher] = weakref.WeakKeyDictionary()


def _publisher() -> _Publisher:
    loop = asyncio.get_running_loop()
    publisher = _publishers.get(loop)
    if publisher is None:
        publisher = _publishers[loop] = _Publisher()
    return publisher


def pipelined_command(*args: Any) -> asyncio.Future[Any]:
    """Send one Redis command on this event loop's publishing connection (:class:`_Publisher`),
    pipelined with the loop's event publishes and other such commands, in call order.

    For small, frequent commands of the runs (the route-entry health scripts,
    ``llm.health.RedisEntryHealth``): a ``redis.asyncio`` call costs the loop ~230–390 µs of
    CPU on the benchmark machine (connection pool, retries, per-call parsing), a pipelined
    one 60–160 µs (bench/README.md).

    Returns:
        A future of the reply as hiredis parses it (bytes, int, lists, None for nil; no
        response callbacks, no decoding).

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
        ValueError: an unknown event type. TypeError: ``data`` is not JSON-serialisable.
        redis.RedisError: the round trip failed (the event may or may not have been stored).
    """
    body, payload = _prepared(session_id=session_id, run_id=run_id, type=type, data=data)
    seq = await _publisher().publish(_script_args(session_id, payload))
    return _frame(seq, body)


def event_publish_nowait(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> asyncio.Future[Any]:
    """:func:`event_publish` without waiting, from the event loop: the event is queued now, so
    it gets a lower ``seq`` than any publish made after this call. The returned future holds
    the event's ``seq`` once it is stored and sent, or the error (as :func:`event_publish`'s).
    """
    _, payload = _prepared(session_id=session_id, run_id=run_id, type=type, data=data)
    return _publisher().publish(_script_args(session_id, payload))


async def events_since(*, session_id: int, after_seq: int, limit: int = STREAM_MAXLEN) -> list[dict[str, Any]]:
    """Async :func:`events_since_sync`."""
    rows = await async_redis().xrange(session_keys(session_id)[1], min=f"({after_seq}-0", max="+", count=limit)
    return [_decode(entry_id, fields) for entry_id, fields in rows]


LAST_SEQS_CHUNK = 1000
"""Most counters one ``MGET`` of :func:`last_seqs` reads."""


async def last_seqs(session_ids: list[int]) -> list[int]:
    """The last ``seq`` handed out in each session (its counter; 0 when it has none or it
    expired), in order: one ``MGET`` per :data:`LAST_SEQS_CHUNK` sessions."""
    heads: list[int] = []
    for start in range(0, len(session_ids), LAST_SEQS_CHUNK):
        keys = [session_keys(session_id)[0] for session_id in session_ids[start:start + LAST_SEQS_CHUNK]]
        heads.extend(int(value or 0) for value in await async_redis().mget(keys))
    return heads


def _decode(entry_id: bytes | str, fields: dict[bytes, bytes]) -> dict[str, Any]:
    raw_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    seq = int(raw_id.split("-", 1)[0])
    return _frame(seq, json.loads(fields[b"e"]))
