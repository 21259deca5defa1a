"""One asyncio event loop per worker process, owned by a daemon thread, hosting every run.

Celery's worker threads submit run coroutines here and wait for them. Runs are I/O bound
(model streams, MCP calls), so one loop carries many at once, and the pooled HTTP clients
and Redis connections live on that one loop.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


def new_run_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind ``RUN_HOST_LOOP`` names: ``uvloop`` (the default; libuv,
    ~2× less CPU per socket read and callback than the standard loop, which matters for a
    loop reading hundreds of model streams) or ``asyncio``."""
    from django.conf import settings

    if settings.RUN_HOST_LOOP == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def tune_interpreter_for_runs() -> None:
    """Set the GIL switch interval to ``RUN_HOST_SWITCH_INTERVAL_MS`` (process-wide).

    A worker's ORM calls run on threads next to the run host's loop thread; with CPython's
    default 5 ms interval a busy ORM thread holds the GIL up to 5 ms at a time while streamed
    tokens wait on the loop (measured: token → client p95 halved at 100 runs with 1 ms;
    bench/README.md)."""
    from django.conf import settings

    sys.setswitchinterval(settings.RUN_HOST_SWITCH_INTERVAL_MS / 1000)


class RunHost:
    def __init__(self) -> None:
        tune_interpreter_for_runs()
        self._loop = new_run_loop()
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
