"""ASGI entry point: HTTP through Django (but the MCP servers: ``/mcp/knowledge/``, the
knowledge bases', :mod:`knowledge.mcp_server`; ``/mcp/agents/``, the agents',
:mod:`sessions.api.mcp_agents`; and ``/a2a/``, the agents' A2A servers,
:mod:`sessions.api.a2a.app`), WebSockets through Channels, the lifespan protocol
through :func:`agent_platform.shutdown.lifespan` (a stop ends the live streams first)."""

import contextvars
import os
import re
from collections.abc import Callable
from typing import TypeVar

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")


def _configure_tracing() -> None:
    """Traces when OTEL_EXPORTER_OTLP_ENDPOINT is set (agent_platform/telemetry.py), before the
    app loads its middleware (the Django instrumentation adds its own)."""
    from agent_platform import telemetry
    from tenants.context import current_tenant_id

    telemetry.configure(service_name="agent-platform-web", tenant_of=current_tenant_id)


_T = TypeVar("_T")


def _apart(build: Callable[[], _T]) -> _T:
    """``build()`` in a copy of this thread's context, so that the context variables it sets
    stay in the copy.

    Why: uvicorn runs its event loop on this thread, and every request's task starts from a
    copy of this context. Building the app fills Django's URL resolvers, and each resolver
    keeps an asgiref ``Local`` that the filling writes: 68 context variables, which every
    request then carried. asgiref's ``_restore_context`` walks every variable of the context
    at each ``sync_to_async`` / ``async_to_sync`` hop and re-homes each ``Local``'s storage
    (~45 µs a hop with 68 of them, ~0.2 µs with none), several hops per request and per
    stream (bench/README.md, "Context variables a request carried")."""
    return contextvars.copy_context().run(build)


_apart(_configure_tracing)
django_asgi_app = _apart(get_asgi_application)


def _fill_url_resolver() -> None:
    """Fill Django's URL resolver now, before the process serves. Filled lazily, by a request's
    first reverse(), every request thread that got there before it was done filled it again
    for itself (Django guards the filling per thread): ~0.5 s of CPU each, 4 threads at once
    in a web process's first burst of requests (bench/README.md, "Credential re-checks
    together"). The console middleware's reverse() fills it too when the handler is built;
    this one does not depend on it."""
    from django.urls import reverse

    reverse("admin:index")


_apart(_fill_url_resolver)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agent_platform.request_threads import RequestThreads  # noqa: E402
from agent_platform.shutdown import lifespan  # noqa: E402
from agent_platform.ws_auth import BrowserOriginValidator, TenantWebsocketAuthMiddleware  # noqa: E402
from browser.routing import websocket_urlpatterns as browser_websocket_urlpatterns  # noqa: E402
from knowledge import mcp_server as knowledge_mcp  # noqa: E402
from sessions.api import mcp_agents  # noqa: E402
from sessions.api.a2a import app as a2a  # noqa: E402
from sessions.api.agent_runs import run_start_gate  # noqa: E402
from sessions.routing import websocket_urlpatterns  # noqa: E402

_session_sockets = BrowserOriginValidator(TenantWebsocketAuthMiddleware(URLRouter(websocket_urlpatterns)))
# The extension's socket has its own auth (device token) and Origin rule: browser/routing.py.
_extension_sockets = URLRouter(browser_websocket_urlpatterns)


async def _websocket(scope, receive, send):
    if scope.get("path", "").startswith("/ws/browser/"):
        return await _extension_sockets(scope, receive, send)
    return await _session_sockets(scope, receive, send)


async def _http(scope, receive, send):
    # The MCP servers speak JSON-RPC over Streamable HTTP through the mcp SDK's transport, an
    # ASGI app of its own (knowledge/mcp_server.py, sessions/api/mcp_agents.py).
    path = scope.get("path", "")
    if knowledge_mcp.handles(path):
        return await knowledge_mcp.application(scope, receive, send)
    if mcp_agents.handles(path):
        return await mcp_agents.application(scope, receive, send)
    # Each agent's A2A server: the a2a-sdk's Starlette routes (sessions/api/a2a/app.py).
    if a2a.handles(path):
        return await a2a.application(scope, receive, send)
    # The chat app's POSTs that start a run take a turn of the same gate as the doors' starts.
    if scope.get("method") == "POST" and RUN_STARTING_POST.match(path):
        async with run_start_gate():
            return await _django(scope, receive, send)
    return await _django(scope, receive, send)


request_threads = RequestThreads()
"""The threads Django's requests run their sync code in, kept from one request to the next:
no thread started (the loop waiting for it) per request (agent_platform/request_threads.py)."""


async def _django(scope, receive, send):
    async with request_threads.request():
        return await django_asgi_app(scope, receive, send)


RUN_STARTING_POST = re.compile(r"^/api/v1/(?:sessions/\d+/(?:messages|regenerate|continue)|runs/\d+/(?:edit|retry))/$")
"""The REST API's POSTs that start a run (sessions/api/urls.py). Each waits for a turn of
:func:`sessions.api.agent_runs.run_start_gate` (``WEB_RUN_STARTS_MAX`` at once) before Django
hands it to a thread: a burst of messages otherwise runs hundreds of request threads at once,
all holding the GIL the event loop needs to deliver other runs' streamed tokens
(bench/README.md, "The chat app's run starts through the gate")."""


# lifespan: the stop signals end the live streams at once (agent_platform/shutdown.py).
application = ProtocolTypeRouter({"http": _http, "websocket": _websocket, "lifespan": lifespan})


def _tune_gc() -> None:
    """Freeze what the app's set-up left alive and set ``WEB_GC_THRESHOLDS``
    (agent_platform/gc_tuning.py): without it the web process stopped for a full collection
    of 147–200 ms in three of five benchmark rounds of 200 runs streaming, and every token in
    flight waited for it (bench/README.md). An empty setting leaves the collector alone (the
    test settings)."""
    from django.conf import settings

    from agent_platform.gc_tuning import gc_freeze_and_set_thresholds

    if settings.WEB_GC_THRESHOLDS:
        gc_freeze_and_set_thresholds(settings.WEB_GC_THRESHOLDS)


_tune_gc()
