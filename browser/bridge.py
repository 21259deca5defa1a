"""Routing browser commands from a run to the run user's connected extension, and back.

Presence. Each connected extension socket (a :class:`browser.consumers.BrowserConsumer`)
registers itself in the Redis hash ``<prefix>:browser:conn:t<tenant>:u<user>`` (field: its
channel name; value: ``{device_id, seen}``), refreshed by every ping (20 s). Entries not seen
for :data:`PRESENCE_STALE_SECONDS` are ignored. Commands therefore only ever reach the
devices of the run's own user and tenant: the key is built from ``ToolContext`` ids.

A command's path:
1. the reply list ``<prefix>:browser:reply:<command id>`` is the waiting "future": it exists
   in Redis before the command is sent, so a reply that is faster than the sender is kept;
2. the command goes to the freshest socket's channel (``channel_layer.send``);
3. the consumer stores it as pending (Redis hash keyed by idempotency key), sends it to the
   extension, and LPUSHes the extension's result to the reply list;
4. if the socket drops, the consumer pushes ``disconnected`` and the pending command stays in
   Redis; when the same device reconnects before the deadline, the command is sent again with
   the same idempotency key and the extension answers from its stored results instead of
   acting twice. Past the deadline the call fails with ``browser_disconnected``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from agent_platform.redis_clients import async_redis, sync_redis

PRESENCE_STALE_SECONDS = 75.0
"""A socket unseen this long (no ping: 3 missed 20-s pings plus slack) counts as gone."""
REPLY_TTL_SECONDS = 120
BLPOP_SLICE_SECONDS = 2.0


class BrowserError(Exception):
    """A browser operation failed; ``code`` is machine-readable, ``message`` is for the model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def presence_key(tenant_id: int, user_id: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:browser:conn:t{tenant_id}:u{user_id}"


def pending_key(tenant_id: int, user_id: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:browser:pending:t{tenant_id}:u{user_id}"


def reply_key(command_id: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:browser:reply:{command_id}"


@dataclass(frozen=True)
class Connection:
    channel_name: str
    device_id: int
    seen: float


def _live(raw: dict[Any, Any]) -> list[Connection]:
    now = time.time()
    conns = []
    for field, value in raw.items():
        info = json.loads(value)
        if now - info["seen"] <= PRESENCE_STALE_SECONDS:
            name = field.decode() if isinstance(field, bytes) else field
            conns.append(Connection(channel_name=name, device_id=info["device_id"], seen=info["seen"]))
    return sorted(conns, key=lambda c: c.seen, reverse=True)


async def connections(*, tenant_id: int, user_id: int) -> list[Connection]:
    """The user's live extension sockets in the tenant, freshest first."""
    return _live(await async_redis().hgetall(presence_key(tenant_id, user_id)))


def connected_device_ids_sync(*, tenant_id: int, user_id: int) -> set[int]:
    """Ids of the user's devices with a live socket (for the device list)."""
    return {c.device_id for c in _live(sync_redis().hgetall(presence_key(tenant_id, user_id)))}


async def bridge_execute(
    *, tenant_id: int, user_id: int, op: str, params: dict[str, Any], deadline_ms: int, idempotency_key: str,
) -> dict[str, Any]:
    """Run ``op`` on the user's connected extension and return its result.

    Args:
        deadline_ms: How long the extension has (and this call waits), in milliseconds.
        idempotency_key: Stable per tool call; a replay after a reconnect is answered from
            the extension's stored results.

    Returns:
        The extension's ``result`` object.

    Raises:
        BrowserError: ``browser_not_connected`` (no live socket: at once),
            ``browser_disconnected`` (the socket dropped and did not come back before the
            deadline), ``browser_timeout`` (no answer before the deadline), or the
            extension's own error code (``stale_ref``, ``origin_blocked``, ...).
    """
    conns = await connections(tenant_id=tenant_id, user_id=user_id)
    if not conns:
        raise BrowserError(
            "browser_not_connected",
            "No browser is connected for this user: the Chrome extension is not paired, not running or offline. "
            "Ask the user to open the Agent Platform extension and check that it shows 'Connected'.",
        )
    target = conns[0]
    command_id = uuid.uuid4().hex
    key = reply_key(command_id)
    redis = async_redis()
    deadline = time.time() + deadline_ms / 1000
    command = {"type": "command", "id": command_id, "op": op, "params": params, "deadline_ms": deadline_ms,
               "idempotency_key": idempotency_key}
    # The reply list is our future: the consumer pushes to it, we pop. Nothing to register
    # in memory, so a reply can never arrive "before the waiter".
    await get_channel_layer().send(target.channel_name, {
        "type": "browser.command", "command": command, "reply_key": key, "deadline": deadline,
        "tenant_id": tenant_id, "user_id": user_id,
    })
    disconnected = False
    try:
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                break
            # Short BLPOPs: redis-py 8 gives every read a 5-s socket timeout.
            popped = await redis.blpop([key], timeout=min(max(0.01, remaining), BLPOP_SLICE_SECONDS))
            if popped is None:
                continue
            message = json.loads(popped[1])
            if message.get("kind") == "disconnected":
                disconnected = True
                continue
            if message.get("kind") == "reconnected":
                disconnected = False
                continue
            frame = message["frame"]
            if frame["ok"]:
                return frame["result"]
            raise BrowserError(frame["error"]["code"], frame["error"]["message"])
    finally:
        await redis.delete(key)
    await redis.hdel(pending_key(tenant_id, user_id), idempotency_key)
    if disconnected:
        raise BrowserError(
            "browser_disconnected",
            f"The browser disconnected while running {op!r} and did not come back within {deadline_ms / 1000:g} s. "
            "The action may or may not have happened: take a browser_snapshot to check before retrying.",
        )
    raise BrowserError("browser_timeout", f"The browser did not answer {op!r} within {deadline_ms / 1000:g} s.")
