"""Requests that one event loop's tasks make within a short window, answered by one call.

:class:`LoopBatch` serves the web process's open streams, which each ask the same small
question over and over: is my credential still valid (:func:`sessions.stream_guard.credential_valid`,
every 15 s), is my session's stream past my last ``seq`` (the readers' catch-up,
:mod:`sessions.event_reader`, every 5 s). One by one, each question was a database query or a
Redis round trip of its own; asked together, the process's streams share one
(bench/README.md, "Credential re-checks together").
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Pending(Generic[K, V]):
    """One loop's requests not yet answered, the timer that answers them, the answers in flight."""

    __slots__ = ("waiting", "timer", "in_flight")

    def __init__(self) -> None:
        self.waiting: dict[K, list[asyncio.Future[V]]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.in_flight: set[asyncio.Future[list[V]]] = set()  # strong references: the loop keeps weak ones


class LoopBatch(Generic[K, V]):
    """Keys asked for within a window, per event loop, answered by one call.

    :meth:`ask` returns a future. The first request of a loop starts a timer of ``window()``
    seconds; then every key asked for meanwhile (each once, in the order first asked) goes to
    one ``await answer(keys)``, which returns the values in the same order, and each request's
    future gets its key's value. An error of the call goes to every future it would have
    answered. A request whose caller stopped waiting (its future cancelled) is left out.

    The call runs in a context of its own (an empty :class:`contextvars.Context`), not in the
    first asker's: that caller may be a request whose asgiref ``ThreadSensitiveContext`` has
    exited by then, and a database call there raises ``RuntimeError`` (seen: 9 and 15 streams of
    two benchmark rounds ended by it).

    Args:
        answer: ``async (keys) -> values``, ``len(values) == len(keys)``. Looked up at each call,
            so it may read module globals that tests replace.
        window: Seconds a first request waits for others (called at each first request).
    """

    def __init__(self, answer: Callable[[list[K]], Awaitable[list[V]]], window: Callable[[], float]) -> None:
        self._answer = answer
        self._window = window
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pending[K, V]] = weakref.WeakKeyDictionary()

    def ask(self, key: K) -> asyncio.Future[V]:
        """A future of ``key``'s value, answered within ``window()`` seconds plus the call.
        Call it on the event loop."""
        loop = asyncio.get_running_loop()
        pending = self._loops.get(loop)
        if pending is None:
            pending = self._loops[loop] = _Pending()
        future: asyncio.Future[V] = loop.create_future()
        pending.waiting.setdefault(key, []).append(future)
        if pending.timer is None:
            pending.timer = loop.call_later(self._window(), self._flush, pending, context=contextvars.Context())
        return future

    def _flush(self, pending: _Pending[K, V]) -> None:
        pending.timer = None
        waiting, pending.waiting = pending.waiting, {}
        waiting = {key: live for key, futures in waiting.items() if (live := [f for f in futures if not f.done()])}
        if not waiting:
            return
        call = asyncio.ensure_future(self._answer(list(waiting)))
        pending.in_flight.add(call)
        call.add_done_callback(functools.partial(self._resolve, pending, waiting))

    @staticmethod
    def _resolve(pending: _Pending[K, V], waiting: dict[K, list[asyncio.Future[V]]],
                 call: asyncio.Future[list[V]]) -> None:
        pending.in_flight.discard(call)
        cancelled = call.cancelled()
        error = None if cancelled else call.exception()
        values: list[V | None] = [None] * len(waiting) if cancelled or error is not None else list(call.result())
        for futures, value in zip(waiting.values(), values, strict=True):
            for future in futures:
                if future.done():
                    continue
                if cancelled:
                    future.cancel()
                elif error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)  # type: ignore[arg-type]
