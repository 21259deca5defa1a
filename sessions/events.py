"""Session events: numbered, kept for replay, fanned out live.

Every event is a JSON frame ``{seq, type, session_id, run_id, data, ts}``. ``seq`` increases
by one per session. Publishing does two things:

1. one atomic Redis script increments the session's counter and appends the event to the
   session's Redis stream (bounded to :data:`STREAM_MAXLEN` entries, stream id ``<seq>-0``),
   so a client that reconnects with the last ``seq`` it saw can replay what it missed;
2. a send to the Channels group ``session.<id>`` for live delivery, as the channel-layer
   message ``{"type": "session.event", "seq": seq, "body": "<the frame's JSON without seq>"}``.

With the project's channel layer (``channels_redis.core.RedisChannelLayer``, one host, the
same Redis as ``REDIS_URL``, msgpack, no encryption, no per-channel capacities) the same
script also does the group send, exactly as ``RedisChannelLayer.group_send`` would (expire
stale members, one message per channel key carrying ``__asgi_channel__``, capacity, expiry,
the 12-byte prefix), with Redis's ``cmsgpack``: one round trip per event instead of five.
The group send was three quarters of a publish's CPU (bench/concurrent_runs.py,
bench/README.md). Any other layer gets the script without the fan-out, then ``group_send``.

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
if ARGV[4] ~= '1' then
  return seq
end
-- channels_redis 4.x RedisChannelLayer.group_send, in the same script
local now = tonumber(ARGV[5])
local whole_seconds = math.floor(now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], 0, whole_seconds - tonumber(ARGV[6]))
local members = redis.call('ZRANGE', KEYS[3], 0, -1)
local channels_of, keys = {}, {}
for _, channel in ipairs(members) do
  local bang = string.find(channel, '!', 1, true)
  local key = ARGV[7] .. (bang and string.sub(channel, 1, bang) or channel)
  if channels_of[key] == nil then
    channels_of[key] = {}
    table.insert(keys, key)
  end
  table.insert(channels_of[key], channel)
end
local capacity, expiry = tonumber(ARGV[8]), tonumber(ARGV[9])
local prefix = string.sub(string.format('%12d', seq), -12)
for _, key in ipairs(keys) do
  redis.call('ZREMRANGEBYSCORE', key, 0, whole_seconds - expiry)
  if redis.call('ZCOUNT', key, '-inf', '+inf') < capacity then
    local message = cmsgpack.pack({type = 'session.event', seq = seq, body = ARGV[1], __asgi_channel__ = channels_of[key]})
    redis.call('ZADD', key, ARGV[5], prefix .. message)
    redis.call('EXPIRE', key, expiry)
  end
end
return seq
"""


def group_name(session_id: int) -> str:
    """The Channels group of a session (ASCII, < 100 characters, as Channels requires)."""
    return f"session.{session_id}"


def _keys(session_id: int) -> list[str]:
    prefix = settings.REDIS_KEY_PREFIX
    return [f"{prefix}:session:{session_id}:seq", f"{prefix}:session:{session_id}:events"]


_fanout_layers: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _script_fans_out(layer: Any) -> bool:
    """Whether the publish script can do ``layer``'s group send itself (see the module docstring)."""
    known = _fanout_layers.get(layer)
    if known is None:
        try:
            from channels_redis.core import RedisChannelLayer
            from channels_redis.serializers import MsgPackSerializer
        except ImportError:  # pragma: no cover - channels_redis is a dependency
            known = False
        else:
            serializer = getattr(layer, "_serializer", None)
            known = (
                type(layer) is RedisChannelLayer
                and len(layer.hosts) == 1
                and layer.hosts[0].get("address") == settings.REDIS_URL
                and not layer.channel_capacity
                and type(serializer) is MsgPackSerializer
                and serializer.crypter is None
                and serializer.random_prefix_length == 12
            )
        _fanout_layers[layer] = known
    return known


def _script_args(session_id: int, payload: str, layer: Any) -> tuple[Any, ...]:
    """``numkeys, *keys, *args`` of :data:`_PUBLISH_LUA` for one event."""
    keys = _keys(session_id)
    if not _script_fans_out(layer):
        return (3, *keys, keys[0], payload, STREAM_MAXLEN, KEY_TTL_SECONDS, "0")
    return (
        3, *keys, layer._group_key(group_name(session_id)), payload, STREAM_MAXLEN, KEY_TTL_SECONDS, "1",
        repr(time.time()), layer.group_expiry, layer.prefix, layer.capacity, int(layer.expiry),
    )


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
    layer = get_channel_layer()
    seq = int(_sync_redis().eval(_PUBLISH_LUA, *_script_args(session_id, payload, layer)))
    if not _script_fans_out(layer):
        async_to_sync(layer.group_send)(group_name(session_id), _layer_message(seq, payload))
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


async def event_publish(*, session_id: int, run_id: int | None, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """Publish now, from async code. Returns the frame (with its ``seq``)."""
    body = _body(session_id=session_id, run_id=run_id, type=type, data=data)
    payload = json.dumps(body)
    layer = get_channel_layer()
    seq = int(await async_redis().eval(_PUBLISH_LUA, *_script_args(session_id, payload, layer)))
    if not _script_fans_out(layer):
        await layer.group_send(group_name(session_id), _layer_message(seq, payload))
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
