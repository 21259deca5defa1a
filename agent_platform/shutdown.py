"""Stopping the web process within a bounded time.

A stop (SIGTERM from an orchestrator, Ctrl-C's SIGINT from ``make run``) goes like this:

1. :func:`shutdown_begin` runs at once, from the signal: :func:`is_stopping` turns true and
   every :func:`wait_stopping` returns, so the live streams end themselves (SSE responses
   finish, session WebSockets close with 1001) while uvicorn stops accepting connections and
   closes the others (WebSockets with 1012).
2. uvicorn waits at most ``--timeout-graceful-shutdown`` (:data:`SHUTDOWN_GRACE_SECONDS`,
   set by :mod:`agent_platform.web`) for its requests to end, then cancels them.
3. A watchdog ends the process :data:`SHUTDOWN_EXIT_MARGIN_SECONDS` after that in any case
   (exit status 128 + the signal's number, as a shell reports a process the signal ended):
   a thread blocked in a synchronous call (Python 3.11's ``asyncio.run`` waits for the
   default executor without a limit, and interpreter exit joins every executor thread)
   cannot keep the process alive.

Step 1 and 3 hook the signals from the ASGI lifespan's startup (:func:`lifespan`, routed by
:mod:`agent_platform.asgi`): uvicorn installs its own SIGINT/SIGTERM handlers before it
starts the application, and ours call it after doing their part. Without a lifespan
(``--lifespan off``) only step 2 applies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from typing import Any, Final

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS: Final[float] = float(os.environ.get("WEB_SHUTDOWN_GRACE_SECONDS", "10"))
"""How long a stopping web process lets open requests finish (uvicorn's
``--timeout-graceful-shutdown``); environment ``WEB_SHUTDOWN_GRACE_SECONDS``, default 10."""
SHUTDOWN_EXIT_MARGIN_SECONDS: Final[float] = 5.0
"""After the grace period, how long the process may take to exit before the watchdog ends it."""

_stopping = threading.Event()
_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
_waiters_lock = threading.Lock()
_watchdog: threading.Timer | None = None


def is_stopping() -> bool:
    """Whether the process has begun to stop (:func:`shutdown_begin` was called)."""
    return _stopping.is_set()


async def wait_stopping() -> None:
    """Return once the process begins to stop (at once if it has). Cancellable."""
    if _stopping.is_set():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    entry = (loop, waiter)
    with _waiters_lock:
        _waiters.add(entry)
    try:
        if not _stopping.is_set():
            await waiter
    finally:
        with _waiters_lock:
            _waiters.discard(entry)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def shutdown_begin(reason: str = "") -> None:
    """Mark the process as stopping and wake every :func:`wait_stopping`. Thread-safe (also
    from a signal handler); idempotent."""
    if _stopping.is_set():
        return
    _stopping.set()
    logger.info("web process stopping%s: ending live streams", f" ({reason})" if reason else "")
    with _waiters_lock:
        waiters = list(_waiters)
    for loop, waiter in waiters:
        if not loop.is_closed():
            loop.call_soon_threadsafe(_wake, waiter)


def _reset_for_tests() -> None:
    """Forget a stop (tests that call :func:`shutdown_begin` in the test process)."""
    _stopping.clear()


def _start_watchdog(signum: int, grace_seconds: float) -> None:
    global _watchdog
    if _watchdog is not None:
        return
    delay = grace_seconds + SHUTDOWN_EXIT_MARGIN_SECONDS

    def expire() -> None:
        logger.error("web process still running %.0f s after the stop signal; exiting", delay)
        logging.shutdown()
        os._exit(128 + signum)

    _watchdog = threading.Timer(delay, expire)
    _watchdog.daemon = True
    _watchdog.start()


def install_signal_handlers(grace_seconds: float = SHUTDOWN_GRACE_SECONDS) -> bool:
    """Chain ours before the current SIGINT/SIGTERM handlers (uvicorn's): on a signal, call
    :func:`shutdown_begin`, start the exit watchdog, then the previous handler.

    Returns False (nothing installed) outside the main thread, where signals cannot be
    handled (e.g. the tests' in-thread server).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)

        def handler(sig: int, frame: Any, previous: Any = previous) -> None:
            shutdown_begin(signal.Signals(sig).name)
            _start_watchdog(sig, grace_seconds)
            if callable(previous):
                previous(sig, frame)
            elif previous == signal.SIG_DFL:
                signal.default_int_handler(sig, frame) if sig == signal.SIGINT else os._exit(128 + sig)

        signal.signal(signum, handler)
    return True


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI lifespan application: on startup, :func:`install_signal_handlers`; on
    shutdown, :func:`shutdown_begin` (if no signal did it already)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            install_signal_handlers()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            shutdown_begin("lifespan shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return
