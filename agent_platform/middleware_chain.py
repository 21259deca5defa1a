"""The last middleware: makes Django run the whole middleware chain in one thread under ASGI.

Django builds the chain from the view up, and each middleware runs in the mode of the one below
it when it can (``load_middleware``). Under ASGI the chain starts async, and every middleware
that is both sync and async capable then runs async; for Django's own (``MiddlewareMixin``:
sessions, CSRF, authentication, messages, …) that means each ``process_request`` and
``process_response`` is handed to a thread by ``sync_to_async``: 18 hand-offs between the event
loop and a thread for one request (seen with cProfile), ~1.2 ms of CPU each request
(bench/middleware_chain.py: 3.1–3.5 ms against 1.9–2.3 ms for a 401 through the whole chain).

:class:`SyncChainEnd` is sync only and comes last in ``settings.MIDDLEWARE``, so every
middleware above it runs sync: one hand-off to the request's thread at the top, one back to
the loop here (``async_to_sync`` around Django's async view dispatch), and the view's own
(a sync view runs in the same request thread). An async view (the SSE stream, the
OpenAI-compatible API) runs on the loop while the request's thread waits for it; a streamed
response is sent by the ASGI handler on the loop, outside the chain.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase


class SyncChainEnd:
    """A sync-only middleware that hands the request on unchanged (see the module docstring)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)
