"""One asyncio event loop per worker process, owned by a daemon thread, hosting every run.

Celery's worker threads submit run coroutines here and wait for them. Runs are I/O bound
(model streams, MCP calls), so one loop carries many at once, and the pooled HTTP clients
and Redis connections live on that one loop.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)


def new_run_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind ``RUN_HOST_LOOP`` names: ``uvloop`` (the default) or
    ``asyncio``.

    Why uvloop: on a machine slow per core, where 200 concurrent runs saturate both cores,
    the worker used ~11 % less CPU per run on uvloop (median 14.7 against 16.6 ms, twelve
    rounds a side of ``bench/concurrent_runs.py`` at N = 200; bench/README.md, session 15):
    uvloop runs the loop itself (polling, transports, timers) in C. On faster machines the
    two measured the same (sessions 9 and 10). The web process runs on uvloop too (uvicorn's
    default when it is installed)."""
    from django.conf import settings

    if settings.RUN_HOST_LOOP == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def tune_interpreter_for_runs() -> None:
    """Tune this process for hosting runs: the GIL switch interval and the garbage collector.

    - ``sys.setswitchinterval(RUN_HOST_SWITCH_INTERVAL_MS)``: a worker's ORM calls run on
      threads next to the run host's loop thread; with CPython's default 5 ms interval a busy
      ORM thread holds the GIL up to 5 ms at a time while streamed tokens wait on the loop
      (measured: token → client p95 halved at 100 runs with 1 ms; bench/README.md).
    - ``gc.freeze()``, then ``gc.set_threshold(*RUN_HOST_GC_THRESHOLDS)``: with 200 runs in a
      process a full collection walked every object (Django, the modules, every run's
      clients) and stopped the loop for 150–165 ms, twice a round of the benchmark. Freezing
      what is alive once the process is set up takes those objects out of every later
      collection (they are still freed by reference counting; only cycles among them would
      stay), and a larger first-generation threshold (CPython's is 700) makes collections
      rare: no full collection in a benchmark round since, one or two young ones of
      18–50 ms (bench/README.md).
      ``gc.freeze`` is CPython's tool for this (docs: "gc.freeze").
    """
    from django.conf import settings

    from agent_platform.gc_tuning import gc_freeze_and_set_thresholds

    sys.setswitchinterval(settings.RUN_HOST_SWITCH_INTERVAL_MS / 1000)
    gc_freeze_and_set_thresholds(settings.RUN_HOST_GC_THRESHOLDS)


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

    def close(self, timeout_seconds: float = 10.0) -> None:
        """Release what the loop holds, then stop it: the MCP pool's sessions (stdio servers
        are terminated, HTTP sessions closed), the model adapters' HTTP pools, the server
        browser (Chromium), the loop's database connections and its Redis publisher.
        (:func:`run_host_shutdown` then ends the database threads.) Waits at most
        ``timeout_seconds``; never raises (a shutdown must go on)."""
        try:
            self.submit(_release_loop_resources()).result(timeout=timeout_seconds)
        except Exception:  # noqa: BLE001
            logger.warning("run host: releasing resources failed or timed out", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout_seconds)


async def _release_loop_resources() -> None:
    from browser.server_backend import server_browser_pool
    from capabilities.mcp.pool import mcp_pool
    from llm.providers import openai_compat
    from sessions.events import publisher_aclose
    from sessions.runner.pg import pg_pool_aclose

    await mcp_pool().aclose()
    await openai_compat.aclose_clients()
    # Only if a run used it: importing the Anthropic SDK to close no client cost the worker's
    # stop seconds of CPU (its models are built at import).
    if (anthropic := sys.modules.get("llm.providers.anthropic")) is not None:
        await anthropic.aclose_clients()
    await server_browser_pool().shutdown()  # Chromium, if a run started it (else nothing to close)
    await pg_pool_aclose()  # the runs' async database connections
    await publisher_aclose()  # last: the steps above may still publish


_host: RunHost | None = None
_host_lock = threading.Lock()


def run_host() -> RunHost:
    """This process's RunHost (created on first use)."""
    global _host
    with _host_lock:
        if _host is None:
            _host = RunHost()
        return _host


def run_host_shutdown(timeout_seconds: float = 10.0) -> bool:
    """Close this process's RunHost if it was started (Celery's ``worker_shutdown``).
    Returns whether there was one."""
    global _host
    with _host_lock:
        host, _host = _host, None
    if host is None:
        return False
    host.close(timeout_seconds)
    from sessions.runner.threads import db_executor_shutdown

    db_executor_shutdown()
    return True
