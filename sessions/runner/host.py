"""One asyncio event loop per worker process, owned by a daemon thread, hosting every run.

Celery's worker threads submit run coroutines here and wait for them. Runs are I/O bound
(model streams, MCP calls), so one loop carries many at once, and the pooled HTTP clients
and Redis connections live on that one loop.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class RunHost:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="run-host", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the host loop; returns a concurrent Future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the host loop and block the calling thread until it is done."""
        return self.submit(coro).result()


_host: RunHost | None = None
_host_lock = threading.Lock()


def run_host() -> RunHost:
    """This process's RunHost (created on first use)."""
    global _host
    with _host_lock:
        if _host is None:
            _host = RunHost()
        return _host
