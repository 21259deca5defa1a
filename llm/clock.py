"""Injectable time for the model layer: what the router waits on and what health state reads.

The router's backoff waits and the health store's cooldowns go through a :class:`Clock`, so
tests swap in a :class:`FakeClock` and assert the exact waits without sleeping. Stream
timeouts (first token, idle, total) are *not* on this clock: they are asyncio timers on the
event loop's own time, because they bound real network waits.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Time source and sleeper.

    ``monotonic()`` is for durations (seconds, arbitrary origin); ``time()`` is Unix epoch
    seconds (cooldown deadlines shared between processes, so they need a common origin);
    ``sleep(seconds)`` waits (a no-op for ``seconds <= 0``).
    """

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`, :func:`asyncio.sleep`."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)


class FakeClock:
    """A clock for tests: :meth:`sleep` records the wait and advances time at once.

    Args:
        start_time: Initial Unix time, seconds (default 1,700,000,000 = 2023-11-14).
        start_monotonic: Initial monotonic reading, seconds.

    Attributes:
        sleeps: Every wait passed to :meth:`sleep`, in order, seconds (zero waits included).

    ``sleep`` still yields to the event loop once (``asyncio.sleep(0)``), so other tasks run
    as they would around a real wait. :meth:`advance` moves both readings by the same amount.
    """

    __slots__ = ("_time", "_monotonic", "sleeps")

    def __init__(self, *, start_time: float = 1_700_000_000.0, start_monotonic: float = 1_000.0) -> None:
        self._time = float(start_time)
        self._monotonic = float(start_monotonic)
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self._monotonic

    def time(self) -> float:
        return self._time

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (finite, >= 0).

        Raises:
            ValueError: negative or non-finite ``seconds``.
        """
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"can only advance by finite seconds >= 0, got {seconds!r}")
        self._time += seconds
        self._monotonic += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


__all__ = ["Clock", "FakeClock", "SystemClock"]
