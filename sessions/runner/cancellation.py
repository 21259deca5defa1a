"""Cancelling a run: a signal in Redis that the worker executing the run watches.

The API process and the worker executing a run are different processes (often different
hosts), so the cancel request travels through Redis in two forms at once:

- a **key** ``{prefix}:run:{id}:cancel`` (TTL one day): durable, so a cancel that was
  requested *before* the worker started watching (a queued run that was just claimed, a
  run resumed after a redelivery) is still seen;
- a **message** on the channel ``{prefix}:run-cancel`` (payload: the run id): immediate, so
  a running run stops within milliseconds instead of at the next poll.

Pub/sub alone loses messages sent while nobody is subscribed (before the watcher starts, or
while its connection reconnects); the key alone would need fast polling by every running
run. :func:`watch_for_cancel` therefore subscribes first, then checks the key, and re-checks
it at most every :data:`POLL_INTERVAL_SECONDS` as a fallback.
"""

from __future__ import annotations

import asyncio
import logging

import redis
import redis.asyncio as aioredis
from django.conf import settings

from sessions.events import async_redis

logger = logging.getLogger(__name__)

CANCEL_KEY_TTL_SECONDS = 24 * 3600
"""A cancel request is kept for a day (longer than any run may stay queued or running)."""
POLL_INTERVAL_SECONDS = 0.5
"""Fallback re-check of the key while no pub/sub message arrives."""
CANCEL_REASON = "cancelled_by_user"
"""``reason`` of the ``run_cancelled`` event (``Run.reason`` stays "": its choices are failure reasons)."""
CANCEL_ERROR = "Cancelled by the user."
"""``Run.error`` of a cancelled run."""


def cancel_key(run_id: int) -> str:
    """The Redis key that marks run ``run_id`` as cancelled."""
    return f"{settings.REDIS_KEY_PREFIX}:run:{run_id}:cancel"


def cancel_channel() -> str:
    """The Redis pub/sub channel that announces cancelled run ids (one channel for all runs)."""
    return f"{settings.REDIS_KEY_PREFIX}:run-cancel"


_sync_client: redis.Redis | None = None


def _sync_redis() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL)
    return _sync_client


def request_cancel_sync(run_id: int) -> None:
    """Ask the worker executing run ``run_id`` to cancel it (from synchronous code).

    Sets :func:`cancel_key` (TTL :data:`CANCEL_KEY_TTL_SECONDS`), then PUBLISHes the run id
    on :func:`cancel_channel`. Idempotent. Does not touch the database: the worker records
    the run's end. Call it after the transaction that checked the run's status committed.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    client = _sync_redis()
    client.set(cancel_key(run_id), "1", ex=CANCEL_KEY_TTL_SECONDS)
    client.publish(cancel_channel(), str(run_id))


async def is_cancel_requested(run_id: int) -> bool:
    """Whether a cancel of run ``run_id`` was requested (the key exists)."""
    return bool(await async_redis().exists(cancel_key(run_id)))


async def watch_for_cancel(run_id: int) -> None:
    """Return as soon as run ``run_id`` is cancelled; run until then (cancel the task to stop).

    Subscribes to :func:`cancel_channel` *before* checking :func:`cancel_key`, so a cancel
    requested at any moment is seen: before the subscription through the key, after it
    through the message (within milliseconds). The key is re-checked at most every
    :data:`POLL_INTERVAL_SECONDS`, which bounds the delay if a message is lost (the pub/sub
    connection dropped) or the subscription failed.

    Holds one dedicated Redis connection for its pub/sub while it runs (not one of the
    shared pool's, which publishers need); key checks use the loop's shared client. The
    pub/sub is read by a helper task with blocking reads and waited on with
    ``asyncio.wait(timeout=…)`` (no redis-py read timeouts), and :func:`raise_if_cancelling`
    runs after each wait: redis-py can swallow a cancel, and the watcher must always stop
    when it is cancelled.

    Raises:
        redis.RedisError: the key cannot be read (the caller decides whether to go on
            without cancellation).
    """
    listener = aioredis.Redis.from_url(settings.REDIS_URL)
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    reader: asyncio.Task[None] | None = None
    try:
        try:
            await pubsub.subscribe(cancel_channel())
            reader = asyncio.create_task(_hear_cancel(pubsub, run_id), name=f"run-{run_id}-cancel-pubsub")
        except redis.RedisError as exc:  # keep the key polling: slower but still works
            logger.warning("run %s: cannot subscribe to cancel requests (%s); polling only", run_id, exc)
        while True:
            raise_if_cancelling()
            if await is_cancel_requested(run_id):
                return
            if reader is None:
                await asyncio.sleep(POLL_INTERVAL_SECONDS)
                continue
            await asyncio.wait({reader}, timeout=POLL_INTERVAL_SECONDS)
            raise_if_cancelling()
            if reader.done():
                if reader.exception() is None:
                    return
                logger.warning("run %s: cancel subscription failed (%r); polling only", run_id, reader.exception())
                reader = None
    finally:
        if reader is not None:
            reader.cancel()
        try:
            await pubsub.aclose()
            await listener.aclose()
        except (redis.RedisError, OSError):
            pass
        if reader is not None:
            await asyncio.wait({reader}, timeout=1.0)


def raise_if_cancelling() -> None:
    """Re-raise a cancellation of the current task that a library swallowed.

    redis-py (8.1, asyncio) sometimes loses a ``Task.cancel()`` that lands inside one of its
    commands: the command returns normally and the task goes on, still "cancelling"
    (measured: ~half of cancels delivered during a burst of commands). Call this after Redis
    calls on a path that must stop when cancelled (the watcher; the runner's publish), so a
    cancelled run never keeps going.

    Raises:
        asyncio.CancelledError: the current task has a pending, unhandled cancel request.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


async def _hear_cancel(pubsub: aioredis.client.PubSub, run_id: int) -> None:
    """Return when ``run_id`` is announced on the subscribed channel (blocking reads)."""
    wanted = str(run_id).encode()
    while True:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
        if message is not None and message.get("data") == wanted:
            return
