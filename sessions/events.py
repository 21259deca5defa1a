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
``PUBLISH``, and a web process reads every session's events from one pub/sub connection.
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
import json
import time
import weakref
from typing import Any

import redis
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

STREAM_MAXLEN = 2000
"""Events kept per session for replay (approximate trim)."""
KEY_TTL_SECONDS = 30 * 24 * 3600
"""Idle sessions' counters and streams expire after 30 days."""

EVENT_TYPES = frozenset(
    {
        "run_queued",
        "run_running",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "content_token",
        "reasoning_token",
        "tool_call_started",
        "tool_call_succeeded",
        "tool_call_failed",
        "todo_updated",
        "model_retry",
        "model_fallback",
        "compaction_running",
        "compaction_completed",
        "run_awaiting_approval",
        "approval_resolved",
        "tool_call_progress",
        "artifact_updated",
        "browser_operation",
    }
)
"""Event names are API: never rename one that shipped."""

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


def _body(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}")
    return {"type": type, "session_id": session_id, "run_id": run_id, "data": data, "ts": time.time()}


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
    body = _body(session_id=session_id, run_id=run_id, type=type, data=data)
    payload = json.dumps(body)  # fails here, at the source, if ``data`` is not JSON-serialisable
    group_channel = _pubsub_group_channel(session_id)
    seq = int(_sync_redis().eval(_PUBLISH_LUA, *_script_args(session_id, payload, group_channel)))
    if group_channel is None:
        async_to_sync(events_layer().group_send)(group_name(session_id), _layer_message(seq, payload))
    return _frame(seq, body)


def event_publish_on_commit(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> None:
    """Publish once the current transaction commits (nothing if it rolls back)."""
    _body(session_id=session_id, run_id=run_id, type=type, data=data)  # validate now
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
"""Most publishes one pipelined round trip carries (:class:`_Publisher`)."""
PUBLISH_WRITERS = 4
"""Round trips one event loop's publisher keeps in flight at once (:class:`_Publisher`)."""


class _Publisher:
    """An event loop's publishes, sent through pipelined round trips, a few at a time.

    A publish that finds a writer free goes at once (one ``EVAL``); publishes made while all
    ``writers`` have a round trip in flight go together in the next one (up to
    :data:`PIPELINE_MAX_EVENTS`). A worker hosting hundreds of runs thereby pays the client's
    per-command work (pool checkout, timeout, retry wrapper) once per batch instead of once
    per event: that was two thirds of a publish's CPU at 200 streaming runs. With one writer,
    a busy loop made every publish wait for the previous batch's reply; four halved the median
    token latency at 200 runs (bench/README.md).

    Order: a publish awaited before another is made gets the lower ``seq``; publishes made
    concurrently (parallel tool calls) may take theirs in any order, as they could before
    (the consumer fills such gaps from the stream). No task is left behind: a writer ends
    when nothing waits.
    """

    def __init__(self, client: aioredis.Redis, writers: int = PUBLISH_WRITERS) -> None:
        self._client = client
        self._waiting: list[tuple[tuple[Any, ...], asyncio.Future[int]]] = []
        self._writers: set[asyncio.Task[None]] = set()
        self._max_writers = writers

    def publish(self, script_args: tuple[Any, ...]) -> "asyncio.Future[int]":
        """Queue one run of :data:`_PUBLISH_LUA`; the future gets its ``seq`` (or its error)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((script_args, future))
        if len(self._writers) < self._max_writers:
            writer = asyncio.ensure_future(self._write())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return future

    async def _write(self) -> None:
        while self._waiting:
            batch = self._waiting[:PIPELINE_MAX_EVENTS]
            del self._waiting[:PIPELINE_MAX_EVENTS]
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    for script_args, _ in batch:
                        pipe.execute_command("EVAL", _PUBLISH_LUA, *script_args)
                    results = await pipe.execute(raise_on_error=False)
            except BaseException as exc:  # the whole round trip failed: every publish in it did
                for _, future in batch:
                    if not future.done():
                        future.cancel() if isinstance(exc, asyncio.CancelledError) else future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    for _, future in self._waiting:
                        future.cancel()
                    self._waiting.clear()
                    raise
                continue
            for (_, future), result in zip(batch, results):
                if future.done():  # its caller was cancelled; the event went out all the same
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(int(result))


_publishers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Publisher]" = weakref.WeakKeyDictionary()


def _publisher() -> _Publisher:
    loop = asyncio.get_running_loop()
    publisher = _publishers.get(loop)
    if publisher is None:
        publisher = _publishers[loop] = _Publisher(async_redis())
    return publisher


async def event_publish(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """Publish now, from async code (pipelined with the loop's other publishes, see
    :class:`_Publisher`). Returns the frame (with its ``seq``).

    Raises:
        redis.RedisError: the round trip failed (the event may or may not have been stored).
    """
    body = _body(session_id=session_id, run_id=run_id, type=type, data=data)
    payload = json.dumps(body)
    group_channel = _pubsub_group_channel(session_id)
    seq = await _publisher().publish(_script_args(session_id, payload, group_channel))
    if group_channel is None:
        await events_layer().group_send(group_name(session_id), _layer_message(seq, payload))
    return _frame(seq, body)


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
