"""The threads a worker process runs its ORM calls on, beside the run host's event loop.

The run lifecycle (:mod:`sessions.runs`) and the runner's reads hand their ORM work here
through :func:`db`; the per-turn statements do not come here at all (plain SQL on the loop's
async pool, :mod:`sessions.runner.pg`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import close_old_connections

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_executor_threads = 0
_executor_lock = threading.Lock()


def db_executor() -> ThreadPoolExecutor:
    """This process's threads for the runner's database calls: ``RUN_HOST_DB_THREADS`` of
    them, named ``run-db_<n>`` (a new pool if the setting changed; the old one finishes its
    calls and ends).

    Not the event loop's default executor: that one also resolves host names
    (``loop.getaddrinfo``), which must not queue behind database calls, and its size
    (CPython: CPUs + 4) let ORM threads take the GIL from the loop that reads model streams.
    """
    global _executor, _executor_threads
    from django.conf import settings

    with _executor_lock:
        if _executor is None or _executor_threads != settings.RUN_HOST_DB_THREADS:
            if _executor is not None:
                _executor.shutdown(wait=False)
            _executor_threads = settings.RUN_HOST_DB_THREADS
            _executor = ThreadPoolExecutor(max_workers=_executor_threads, thread_name_prefix="run-db")
        return _executor


def db_executor_shutdown() -> None:
    """End :func:`db_executor`'s threads once their calls are done (the run host's shutdown)."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=True)


def db(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` as a coroutine function run on one of :func:`db_executor`'s threads, with a
    pooled connection (returned to the pool after the call, as Channels'
    ``database_sync_to_async`` does: ``close_old_connections()`` before and after).

    Not thread-sensitive: the runs a worker hosts would otherwise queue behind one thread
    for every ORM call. The caller's context (the tenant ContextVar) is copied into the
    thread. A cancelled caller stops waiting; a call already running finishes.

    Plain ``loop.run_in_executor`` rather than asgiref's ``SyncToAsync``, whose machinery
    (thread-sensitive contexts, deadlock detection, a new wrapper object per call) the
    runner does not need: measured 30–60 µs less event-loop CPU per call.
    """

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> T:
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            db_executor(), context.run, _on_db_thread, fn, args, kwargs
        )

    return call


def _on_db_thread(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()
