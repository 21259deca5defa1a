"""Threads for Django's sync request work, kept from one request to the next.

Under ASGI, Django runs each HTTP request in an ``asgiref`` ``ThreadSensitiveContext`` of its
own, and the first thread-sensitive ``sync_to_async`` call in it (for us: every request, since
the whole middleware chain runs sync, :mod:`agent_platform.middleware_chain`) makes a new
one-thread executor. So each request started a thread, and on its end another one to join
the first (asgiref 3.13, ``ThreadSensitiveContext.__aexit__``). ``Thread.start`` blocks its
caller until the new thread has run: here the event loop, which meanwhile handed no streamed
token on. On two busy cores that is the wait for the scheduler, twice a request.

:class:`RequestThreads` keeps idle one-thread executors and gives each request one of them
through ``ThreadSensitiveContext(executor=…)``, which Django's own context inside it then
leaves in place (asgiref: only the outermost context sets it). A request still runs its sync
code in one thread of its own, one call at a time, as Django expects; the thread is simply
not new. An executor goes back to the idle ones only if nothing of its request is still
running in it (a client that went away leaves its view running in the thread: that executor
is shut down once the view returns, without waiting on the loop).

Thread-local state then outlives a request, as under WSGI: Django closes its database
connections at each request's end (``request_finished``); the tenant scope is a
``ContextVar`` (:mod:`tenants.context`), copied into the thread for each call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext

IDLE_MAX = 64
"""Idle executors (one thread each) kept for later requests; one ending when this many are idle
is shut down. About the sync requests a web process has in flight at once in a burst (run
starts go one at a time, :func:`sessions.api.agent_runs.run_start_gate`)."""


class _RequestExecutor(ThreadPoolExecutor):
    """One thread, and a count of the calls submitted to it and not yet done."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="django-request")
        self._lock = threading.Lock()
        self._in_flight = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self._in_flight += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: Future[Any] | None) -> None:
        with self._lock:
            self._in_flight -= 1

    def idle(self) -> bool:
        with self._lock:
            return self._in_flight == 0


class RequestThreads:
    """Idle one-thread executors for requests' sync work (see the module docstring).

    Use on the event loop's thread: ``async with threads.request(): await django_app(scope,
    receive, send)``. Not thread-safe: use it from one thread at a time (the web process: its
    event loop's).

    Args:
        idle_max: Idle executors kept at most (:data:`IDLE_MAX`).
    """

    def __init__(self, idle_max: int = IDLE_MAX) -> None:
        self.idle_max = idle_max
        self._idle: list[_RequestExecutor] = []
        self.started = 0  # executors made, for tests and benchmarks

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        """The block's thread-sensitive sync calls run in an idle executor's thread (or a new
        one's), which is kept for a later request afterwards if it is idle."""
        if self._idle:
            executor = self._idle.pop()
        else:
            executor = _RequestExecutor()
            self.started += 1
        try:
            async with ThreadSensitiveContext(executor=executor):
                yield
        finally:
            if executor.idle() and len(self._idle) < self.idle_max:
                self._idle.append(executor)
            else:
                executor.shutdown(wait=False)  # its thread ends after the call it runs

    def idle_count(self) -> int:
        """How many idle executors are kept now."""
        return len(self._idle)
