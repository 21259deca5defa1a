"""Under ASGI the middleware chain runs in the request's thread (agent_platform/middleware_chain.py):
one hand-off to a thread at the top and one back to the loop at the bottom, not two per
middleware."""

from __future__ import annotations

import os
import subprocess
import sys

from asgiref.sync import AsyncToSync, SyncToAsync
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from agent_platform.middleware_chain import SyncChainEnd


def _chain(handler: ASGIHandler) -> list[object]:
    """The middleware chain of ``handler``, outermost first, adapters included."""
    links, link = [], handler._middleware_chain
    while link is not None:
        links.append(link)
        link = (getattr(link, "__wrapped__", None) or getattr(link, "get_response", None)
                or getattr(link, "awaitable", None))
    return links


def test_the_asgi_chain_hands_off_once_at_each_end():
    """Before: SyncToAsync for each MiddlewareMixin's process_request and process_response,
    at run time (invisible here), because the chain above the view was async."""
    links = _chain(ASGIHandler())
    adapters = [i for i, link in enumerate(links) if isinstance(link, (SyncToAsync, AsyncToSync))]
    assert [type(links[i]).__name__ for i in adapters] == ["SyncToAsync", "AsyncToSync"]
    last = next(i for i, link in enumerate(links) if isinstance(link, SyncChainEnd))
    assert adapters == [0, last + 1], "a thread at the top, the loop again only below the last middleware"
    assert links[-1].__name__ == "_get_response_async"


def test_it_is_the_last_middleware():
    assert settings.MIDDLEWARE[-1] == "agent_platform.middleware_chain.SyncChainEnd"


def test_the_url_resolver_is_filled_before_the_first_request():
    """A web process imports its ASGI app before it serves; the URL resolver must be filled
    then. Filled lazily, by the first reverse() of a request, each request thread of the first
    burst that got there before it was done filled it again for itself: ~0.5 s of CPU each,
    4 threads at once in a web process seen with py-spy (bench/README.md)."""
    probe = ("import agent_platform.asgi\n"
             "from django.urls import get_resolver\n"
             "print(get_resolver()._populated)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


_CONTEXT_PROBE = """
import asyncio, contextvars
import asgiref.sync
import agent_platform.asgi as asgi

widths = []
restore = asgiref.sync._restore_context
def counted(context):
    widths.append(len(context))
    return restore(context)
asgiref.sync._restore_context = counted

async def main():
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": "/metrics", "raw_path": b"/metrics", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}
    sent, body, done = [], [{"type": "http.request", "body": b"", "more_body": False}], asyncio.Event()
    async def receive():
        if body:
            return body.pop()
        await done.wait()
        return {"type": "http.disconnect"}
    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()
    await asgi.application(scope, receive, send)
    return sent[0]["status"]

print(sum(var.name == "asgiref.local" for var in contextvars.copy_context()))
print(asyncio.run(main()), len(widths), max(widths, default=0))
"""


def test_a_request_does_not_carry_the_url_resolvers_context_variables():
    """uvicorn runs the loop on the thread that imported the app, so every request starts from a
    copy of that thread's context. Building the app fills the URL resolvers, and each resolver's
    asgiref ``Local`` left a context variable there: 68 of them, which asgiref walked and
    re-homed at every sync/async hop of every request (~45 µs a hop). The app is now built in a
    context of its own (agent_platform/asgi.py, ``_apart``)."""
    done = subprocess.run([sys.executable, "-c", _CONTEXT_PROBE], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings"})
    assert done.returncode == 0, done.stderr[-2000:]
    locals_left, request = done.stdout.strip().splitlines()[-2:]
    assert locals_left == "0", "no asgiref Local storage in the context requests start from"
    status, hops, widest = map(int, request.split())
    assert status == 404, "the metrics endpoint answers 404 without its token: the request went through Django"
    assert hops >= 2, "the request crossed between the loop and a thread"
    assert widest < 10, f"a hop restored {widest} context variables"
