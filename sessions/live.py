"""Live session events in the web process: one Redis pub/sub subscription per event loop.

The WebSocket consumers of ``/ws/sessions/<id>/`` and the SSE streams take their session's
live events from here: the publish script (:mod:`sessions.events`) publishes every event on
the session's channel (:func:`sessions.events.live_channel`) as the msgpack of
``{"type": "session.event", "seq", "body"}``; other channels (the revoked-tokens channel,
:mod:`agent_platform.revocations`) carry msgpack maps too.

The subscription connection is this module's own asyncio streams
(:func:`agent_platform.redis_clients.redis_stream_open`: host or unix socket, TLS, AUTH,
SELECT), commands packed with ``hiredis.pack_command`` and replies parsed with a public
``hiredis.Reader``; redis-py's connection objects are not used.

Why not the channel layer: per event, channels_redis's receive loop calls ``get_message``
under a timeout, puts the message in the receiving channel's queue, and Channels'
``await_many_dispatch`` then waits on it with ``asyncio.wait`` and a new task per message.
With 200 runs streaming, the web process handles ~8,000 events a second, and on a slow
machine the tail of token → client latency was spent between the worker's write to Redis and
the consumer's send (bench/README.md, session 15). Here one reader per loop parses every
message of a read with one ``hiredis.Reader`` and hands it to each listener synchronously:
26–39 µs of the loop's CPU per event through the layer against 6–10 µs this way (100
sessions × 100 events, the same queue get on the receiving side; bench/fanout_receive.py),
and the web process's CPU per run at N = 200 fell by ~38 % (bench/README.md, session 15).

Contract with a listener (a callable taking one argument, called on the loop, in order):

- ``listener(message)`` for each message published on its channel after :func:`live_join`
  returned;
- ``listener(None)`` after the subscription was lost (Redis restarted, the connection
  killed) and restored: what was published meanwhile is not delivered, and the listener must
  read it from the session's stream (the consumer does).

Failures: :func:`live_join` raises ``TimeoutError`` if Redis has not confirmed the
subscription within :data:`JOIN_TIMEOUT_SECONDS`. A lost connection is reopened (backoff
0.1 s doubling to 2 s) while anyone listens; a connection silent for
:data:`IDLE_PING_SECONDS` is pinged, and given up if still silent as long again.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any, Final

import hiredis
import msgpack

from agent_platform.redis_clients import NOT_ENOUGH_DATA, READ_BYTES, redis_stream_open, reply_reader

logger = logging.getLogger(__name__)

Listener = Callable[[dict[str, Any] | None], None]

JOIN_TIMEOUT_SECONDS: Final[float] = 10.0
"""How long :func:`live_join` waits for Redis to confirm a new subscription."""
IDLE_PING_SECONDS: Final[float] = 15.0
"""A subscription connection silent this long is pinged (a dead peer is noticed)."""


class _Subscriber:
    """One loop's subscription connection and the listeners of each channel."""

    def __init__(self) -> None:
        self._listeners: dict[bytes, list[Listener]] = {}
        self._confirmations: dict[bytes, list[asyncio.Future[None]]] = {}  # SUBSCRIBEs not yet confirmed
        self._lost: set[bytes] = set()  # channels whose listeners get None once resubscribed
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def join(self, channel: bytes, listener: Listener) -> None:
        listeners = self._listeners.setdefault(channel, [])
        listeners.append(listener)
        if len(listeners) == 1 or channel in self._confirmations:
            confirmed = asyncio.get_running_loop().create_future()
            self._confirmations.setdefault(channel, []).append(confirmed)
            if len(listeners) == 1:
                self._send("SUBSCRIBE", channel)
            self._start()
            try:
                async with asyncio.timeout(JOIN_TIMEOUT_SECONDS):
                    await confirmed
            except BaseException:
                self.leave(channel, listener)
                raise

    def leave(self, channel: bytes, listener: Listener) -> None:
        listeners = self._listeners.get(channel)
        if listeners is None or listener not in listeners:
            return
        listeners.remove(listener)
        if listeners:
            return
        del self._listeners[channel]
        self._lost.discard(channel)
        for confirmed in self._confirmations.pop(channel, []):
            confirmed.cancel()
        if not self._listeners:
            self._close()  # the reader ends; the next join opens a new connection
        else:
            self._send("UNSUBSCRIBE", channel)

    def _send(self, *command: Any) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(hiredis.pack_command(command))
        # else: the channel is subscribed with all the others when the connection opens

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def _close(self) -> None:
        writer, self._writer = self._writer, None  # _read sees the end as a close of ours
        if writer is not None:
            writer.close()

    async def _run(self) -> None:
        """Keep a connection subscribed to every channel with listeners; read it."""
        backoff = 0.1
        while self._listeners:
            try:
                reader, writer = await redis_stream_open()
            except Exception as exc:  # noqa: BLE001 - Redis down: try again while anyone listens
                logger.warning("live events: cannot connect to Redis (%r); retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            if not self._listeners:  # the last listener left while this connected
                writer.close()
                return
            self._writer = writer
            self._send("SUBSCRIBE", *self._listeners)
            try:
                await self._read(reader)
            except Exception as exc:  # noqa: BLE001 - the connection is lost; open another
                logger.warning("live events: subscription connection lost (%r)", exc)
                self._lost.update(self._listeners)  # unsubscribed by the loss: listeners must catch up
            finally:
                self._writer = None
                writer.close()

    async def _read(self, stream: asyncio.StreamReader) -> None:
        replies = reply_reader()  # a malformed reply raises: the connection is reopened
        pinged = False
        while True:
            try:
                async with asyncio.timeout(IDLE_PING_SECONDS):
                    data = await stream.read(READ_BYTES)
            except TimeoutError:
                if pinged:
                    raise ConnectionError(f"Redis did not answer a PING within {IDLE_PING_SECONDS:g} s") from None
                pinged = True
                self._send("PING")
                continue
            if not data:
                if self._writer is None:
                    return  # closed by _close(): the last listener left
                raise ConnectionError("Redis closed the subscription connection")
            pinged = False
            replies.feed(data)
            while (reply := replies.gets()) is not NOT_ENOUGH_DATA:
                self._handle(reply)

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return  # PONG
        kind, channel = reply[0], reply[1]  # an "unsubscribe" confirmation needs nothing
        if kind == b"message":
            listeners = self._listeners.get(channel)
            if listeners:
                message = msgpack.unpackb(reply[2])
                for listener in tuple(listeners):
                    listener(message)
        elif kind == b"subscribe":
            for confirmed in self._confirmations.pop(channel, []):
                if not confirmed.done():
                    confirmed.set_result(None)
            if channel in self._lost and channel in self._listeners:
                self._lost.discard(channel)
                for listener in tuple(self._listeners[channel]):
                    listener(None)


_subscribers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Subscriber] = weakref.WeakKeyDictionary()


def _subscriber() -> _Subscriber:
    loop = asyncio.get_running_loop()
    subscriber = _subscribers.get(loop)
    if subscriber is None:
        subscriber = _subscribers[loop] = _Subscriber()
    return subscriber


async def live_join(channel: str, listener: Listener) -> None:
    """Subscribe ``listener`` to ``channel`` (a Redis pub/sub channel name); returns once Redis
    has confirmed the subscription, so every message published after this returns reaches it.

    Raises:
        TimeoutError: no confirmation within :data:`JOIN_TIMEOUT_SECONDS` (the listener is
            removed again).
    """
    await _subscriber().join(channel.encode(), listener)


def live_leave(channel: str, listener: Listener) -> None:
    """Stop calling ``listener`` for ``channel`` (nothing if it was not joined)."""
    _subscriber().leave(channel.encode(), listener)
