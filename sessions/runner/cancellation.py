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
it at most every :data:`POLL_INTERVAL_SECONDS` as a fallback. One :class:`CancelHub` per event
loop does both for every run the loop hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref

import redis
import redis.asyncio as aioredis
from django.conf import settings

from agent_platform.redis_clients import async_redis, async_redis_dedicated, sync_redis
from sessions.events import pipelined_command

logger = logging.getLogger(__name__)

CANCEL_KEY_TTL_SECONDS = 24 * 3600
"""A cancel request is kept for a day (longer than any run may stay queued or running)."""
POLL_INTERVAL_SECONDS = 0.5
"""Fallback re-check of the key while no pub/sub message arrives."""
SUBSCRIBE_WAIT_SECONDS = 1.0
"""How long a new watch waits for the hub's subscription before relying on the poll."""
CANCEL_REASON = "cancelled_by_user"
"""``reason`` of the ``run_cancelled`` event (``Run.reason`` stays "": its choices are failure reasons)."""
CANCEL_ERROR = "Cancelled by the user."
"""``Run.error`` of a cancelled run."""


def cancel_key(run_id: int) -> str:
    """The Redis key that marks run ``run_id`` as cancelled."""
    return f"{settings.REDIS_KEY_PREFIX}:run:{run_id}:cancel"


def hub_client_name() -> str:
    """The Redis client name of a :class:`CancelHub`'s pub/sub connection (``CLIENT LIST``)."""
    return f"{settings.REDIS_KEY_PREFIX}:cancel-hub"


def cancel_channel() -> str:
    """The Redis pub/sub channel that announces cancelled run ids (one channel for all runs)."""
    return f"{settings.REDIS_KEY_PREFIX}:run-cancel"


def request_cancel_sync(run_id: int) -> None:
    """Ask the worker executing run ``run_id`` to cancel it (from synchronous code).

    Sets :func:`cancel_key` (TTL :data:`CANCEL_KEY_TTL_SECONDS`), then PUBLISHes the run id
    on :func:`cancel_channel`. Idempotent. Does not touch the database: the worker records
    the run's end. Call it after the transaction that checked the run's status committed.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    client = sync_redis()
    client.set(cancel_key(run_id), "1", ex=CANCEL_KEY_TTL_SECONDS)
    client.publish(cancel_channel(), str(run_id))


async def is_cancel_requested(run_id: int) -> bool:
    """Whether a cancel of run ``run_id`` was requested (the key exists). Asked on the loop's
    publishing connection (:func:`~sessions.events.pipelined_command`): every run asks once
    at its start, and a ``redis.asyncio`` call costs the loop several times as much CPU."""
    return bool(await pipelined_command("EXISTS", cancel_key(run_id)))


async def watch_for_cancel(run_id: int) -> None:
    """Return as soon as run ``run_id`` is cancelled; run until then (cancel the task to stop).

    Waits on this event loop's :class:`CancelHub`: one pub/sub subscription and one key
    poller for every run the loop hosts (a connection and a poll per run cost a worker
    carrying 200 runs 10–15 % of its CPU; bench/README.md). The hub's subscription is
    confirmed *before* :func:`cancel_key` is checked, so a cancel requested at any moment is
    seen: before the subscription through the key, after it through the message (within
    milliseconds). The hub re-reads the keys of every watched run at most every
    :data:`POLL_INTERVAL_SECONDS`, which bounds the delay if a message is lost (the pub/sub
    connection dropped) or the subscription failed.

    Raises:
        redis.RedisError: the key cannot be read at the start (the caller decides whether
            to go on without cancellation).
    """
    await CancelHub.for_running_loop().wait(run_id)


class CancelHub:
    """Every cancel watch of one event loop: one pub/sub connection, one poller.

    Runs call :meth:`wait`; the hub's task (started with the first watch, stopped with the
    last) reads :func:`cancel_channel` and, every :data:`POLL_INTERVAL_SECONDS`, the keys of
    all watched runs in one ``MGET``, and resolves the futures of the runs named. If the
    subscription breaks, the hub logs it, keeps polling and subscribes again.
    """

    _hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CancelHub] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()  # the current task's first subscribe attempt ended (ok or not)

    @classmethod
    def for_running_loop(cls) -> CancelHub:
        """The hub of the running event loop (created on first use)."""
        loop = asyncio.get_running_loop()
        hub = cls._hubs.get(loop)
        if hub is None:
            hub = cls._hubs[loop] = cls()
        return hub

    @property
    def watched(self) -> int:
        """How many runs are watched now."""
        return len(self._waiters)

    async def wait(self, run_id: int) -> None:
        """Return when run ``run_id`` is cancelled (see :func:`watch_for_cancel`).

        Raises:
            redis.RedisError: the first check of the key failed.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(run_id, []).append(future)
        try:
            if self._task is None or self._task.done():
                self._subscribed = asyncio.Event()
                self._task = asyncio.create_task(self._serve(self._subscribed), name="run-cancel-hub")
            # A subscription that hangs must not hold the run: the poll covers for it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SUBSCRIBE_WAIT_SECONDS):
                    await self._subscribed.wait()
            if await is_cancel_requested(run_id):
                return
            raise_if_cancelling()
            await future
        finally:
            futures = self._waiters.get(run_id, [])
            if future in futures:
                futures.remove(future)
            if not futures:
                self._waiters.pop(run_id, None)
            if not self._waiters and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)  # it holds nothing a run needs

    def _resolve(self, run_id: int) -> None:
        for future in self._waiters.get(run_id, []):
            if not future.done():
                future.set_result(None)

    async def _poll(self) -> None:
        run_ids = list(self._waiters)
        if not run_ids:
            return
        try:
            values = await async_redis().mget([cancel_key(r) for r in run_ids])
        except redis.RedisError as exc:
            logger.warning("cannot read cancel requests (%s); retrying", exc)
            return
        for run_id, value in zip(run_ids, values, strict=False):
            if value is not None:
                self._resolve(run_id)

    async def _serve(self, subscribed: asyncio.Event) -> None:
        """Subscribe, read messages, poll keys; subscribe again after a failure."""
        while True:
            listener = async_redis_dedicated(client_name=hub_client_name())
            pubsub = listener.pubsub(ignore_subscribe_messages=True)
            reader: asyncio.Task[None] | None = None
            try:
                try:
                    await pubsub.subscribe(cancel_channel())
                    reader = asyncio.create_task(self._read(pubsub), name="run-cancel-hub-pubsub")
                except redis.RedisError as exc:  # keep polling: slower but still works
                    logger.warning("cannot subscribe to cancel requests (%s); polling only", exc)
                finally:
                    subscribed.set()
                while reader is not None and not reader.done():
                    await asyncio.wait({reader}, timeout=POLL_INTERVAL_SECONDS)
                    raise_if_cancelling()
                    await self._poll()
                if reader is not None and not reader.cancelled() and reader.exception() is not None:
                    logger.warning("cancel subscription failed (%r); subscribing again", reader.exception())
                await asyncio.sleep(POLL_INTERVAL_SECONDS)
                raise_if_cancelling()
                await self._poll()
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

    async def _read(self, pubsub: aioredis.client.PubSub) -> None:
        """Resolve the runs announced on the subscribed channel (blocking reads)."""
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            if message is None:
                continue
            try:
                run_id = int(message.get("data"))
            except (TypeError, ValueError):
                continue
            self._resolve(run_id)


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
