"""CPU per request through Django's middleware chain under ASGI, with the chain as configured
(``SyncChainEnd`` last: the chain runs in the request's thread) and without it (each of
Django's ``MiddlewareMixin`` middleware hands its ``process_request`` and ``process_response``
to a thread; agent_platform/middleware_chain.py); and as the web process serves it, each
request's sync work in a thread kept from earlier requests (agent_platform/request_threads.py)
rather than one Django's handler starts for it (and another that joins it at the end); and as
served before agent_platform/asgi.py built the app in a context of its own (``_apart``): each
request's context carrying a context variable for every URL resolver's asgiref ``Local``,
which asgiref walks at every hop between the loop and a thread.

In one process, no network: httpx's ``ASGITransport`` sends requests one at a time to Django's
``ASGIHandler`` (the same app the web process serves, middleware and all). Two paths that need
no database row: ``GET /api/v1/auth/me/`` without credentials (a sync DRF view: 401) and
``GET /api/openai/v1/models`` without a token (an async view: 401). The variants alternate
(ABAB…), each round ``--requests`` requests after a warm-up; printed: CPU µs per request
(``time.process_time``), median and range over the rounds. Django's warning log line per 401
is off (both variants would pay it alike).

Run: ``.venv/bin/python bench/middleware_chain.py [--rounds 4] [--requests 2000]``
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextvars  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

os.environ.setdefault("THROTTLE_ANON", "")  # 4,000 anonymous requests: no throttle answers
import _harness  # noqa: E402,F401  (Django's settings)
from _stats import machine  # noqa: E402

PATHS = {"sync view (DRF, 401)": "/api/v1/auth/me/", "async view (OpenAI API, 401)": "/api/openai/v1/models"}
END = "agent_platform.middleware_chain.SyncChainEnd"


def _handler(with_end: bool):
    from django.conf import settings
    from django.core.handlers.asgi import ASGIHandler

    configured = list(settings.MIDDLEWARE)
    settings.MIDDLEWARE = configured if with_end else [m for m in configured if m != END]
    try:
        return ASGIHandler()  # reads MIDDLEWARE here
    finally:
        settings.MIDDLEWARE = configured


def _kept_threads(handler):
    """``handler`` as agent_platform/asgi.py serves Django: each request's sync work in a kept
    thread (agent_platform/request_threads.py), not a new one."""
    from agent_platform.request_threads import RequestThreads

    threads = RequestThreads()

    async def app(scope, receive, send):
        async with threads.request():
            return await handler(scope, receive, send)

    return app


def _resolvers_filled_in_it() -> contextvars.Context:
    """A context in which Django's URL resolvers were filled, as the web process's main context
    (which every request copies) was before agent_platform/asgi.py built the app apart: each
    resolver's ``Local`` left a context variable in it."""
    from django.urls import clear_url_caches, reverse

    clear_url_caches()
    context = contextvars.copy_context()
    context.run(reverse, "admin:index")
    return context


async def _round(handler, path: str, requests: int) -> float:
    """CPU µs per request over ``requests`` requests (after 200 unmeasured)."""
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=handler), base_url="http://127.0.0.1") as client:
        for _ in range(200):
            await client.get(path)
        start = time.process_time()
        for _ in range(requests):
            response = await client.get(path)
        elapsed = time.process_time() - start
    if response.status_code != 401:
        raise SystemExit(f"{path}: expected 401, got {response.status_code}")
    return elapsed / requests * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    print(machine())
    logging.getLogger("django.request").setLevel(logging.ERROR)  # not a warning line per 401
    clean = contextvars.copy_context()  # as agent_platform/asgi.py leaves the loop's thread

    def apart(build):
        return contextvars.copy_context().run(build)

    served = apart(lambda: _kept_threads(_handler(True)))
    variants = {  # name: (handler, the context its requests start from)
        "as served (threads kept)": (served, clean),
        "as served, the resolvers' Locals carried": (served, _resolvers_filled_in_it()),
        "SyncChainEnd last, a thread per request": (apart(lambda: _handler(True)), clean),
        "without SyncChainEnd, a thread per request": (apart(lambda: _handler(False)), clean),
    }
    carried = sum(var.name == "asgiref.local" for var in variants["as served, the resolvers' Locals carried"][1])
    print(f"context variables of asgiref Locals carried: {carried} (the second variant), "
          f"{sum(var.name == 'asgiref.local' for var in clean)} (the others)")
    for label, path in PATHS.items():
        figures: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (handler, context) in variants.items():
                figures[name].append(await asyncio.create_task(_round(handler, path, args.requests), context=context))
        for name, values in figures.items():
            print(f"{label:30} {name:44} {statistics.median(values):7.0f} µs CPU/request "
                  f"({min(values):.0f}–{max(values):.0f}, {args.rounds} rounds of {args.requests})")


if __name__ == "__main__":
    asyncio.run(main())
