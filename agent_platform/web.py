"""The web process: uvicorn serving the project's ASGI app (HTTP and WebSockets) with the
platform's server options.

``python -m agent_platform.web [uvicorn options]`` is ``uvicorn agent_platform.asgi:application``
with :data:`SERVER_OPTIONS` put first, so every uvicorn option still works (``--host``,
``--port``, ``--proxy-headers``, ``--workers``, …) and one given on the command line wins over
ours. ``make run``, the Docker image, docker-compose and the benchmarks start the web process
this way; the tests' live server builds its ``uvicorn.Config`` with the same options.

Why ``ws_per_message_deflate=False``: the session socket carries many small frames (a streamed
text delta every 25 ms per run, a few hundred bytes each). With RFC 7692 compression every
frame is deflated by the server and inflated by the browser, and each connection keeps its
zlib state. Off, the web process spent ~10 % less CPU per run and token → client p95 at 200
concurrent runs fell from a median of 53.9 ms to 44.4 ms (bench/concurrent_runs.py, 16
alternating rounds each; bench/README.md, session 10). engine.io turned it off by default for
the memory it holds per connection.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final

from agent_platform.shutdown import SHUTDOWN_GRACE_SECONDS

APP: Final[str] = "agent_platform.asgi:application"

SERVER_OPTIONS: Final[dict[str, Any]] = {
    "ws_per_message_deflate": False,
    "timeout_graceful_shutdown": int(SHUTDOWN_GRACE_SECONDS),
}
"""Keyword arguments of ``uvicorn.Config`` that differ from uvicorn's defaults.

``timeout_graceful_shutdown``: a stop (SIGTERM, Ctrl-C) waits at most this many seconds
(``WEB_SHUTDOWN_GRACE_SECONDS``, default 10) for open requests, then cancels them; uvicorn's
default waits for ever, and an open event stream never ends by itself. The live streams end
at the signal already, and a watchdog ends a process still alive 5 s after the grace period
(:mod:`agent_platform.shutdown`)."""


def cli_args(options: dict[str, Any] = SERVER_OPTIONS) -> list[str]:
    """``options`` as uvicorn command-line options: ``{"ws_per_message_deflate": False}`` →
    ``["--ws-per-message-deflate", "false"]`` (booleans lower-case, as click reads them)."""
    args: list[str] = []
    for key, value in options.items():
        args += ["--" + key.replace("_", "-"), str(value).lower() if isinstance(value, bool) else str(value)]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run uvicorn's command line on :data:`APP` with :data:`SERVER_OPTIONS` first, then
    ``argv`` (default: this process's arguments). Exits as uvicorn does."""
    import uvicorn

    args = [APP, *cli_args(), *(sys.argv[1:] if argv is None else argv)]
    uvicorn.main.main(args=args, prog_name="python -m agent_platform.web")


if __name__ == "__main__":
    main()
