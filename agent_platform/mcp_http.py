"""What the platform's MCP servers share at the HTTP edge: ``/mcp/knowledge/``
(:mod:`knowledge.mcp_server`) and ``/mcp/agents/`` (:mod:`sessions.api.mcp_agents`).

They answer outside Django's middleware (the ``mcp`` SDK's Streamable HTTP transport is an ASGI
app of its own, routed in :mod:`agent_platform.asgi`), so they keep that middleware's rules
themselves, in one place, :func:`serve`, in this order:

1. ``Host`` must be one of ``ALLOWED_HOSTS`` (else 400, logged as Django logs it);
2. only POST (405 with ``Allow: POST``): the servers are stateless and open no GET stream;
3. a bearer token (401 with ``WWW-Authenticate`` without one);
4. the client address's failed-login budget (``mcp_auth.ip`` of ``API_THROTTLE_RATES``): over it,
   a 429 with ``Retry-After`` before the token is looked at;
5. :func:`authenticate`, the one authentication step (401 for a bad token, and the failure
   counted);
6. ``Content-Type: application/json`` (else 415: the transport's own check would answer a
   plain-text 400);
7. the server's own handler, with the :class:`McpRequest`.

Every answer carries Django's security headers
(:func:`agent_platform.security_headers.security_headers_for`); refusals are the platform's
``{message, extra}``. Blocking work (the token check) runs on a bounded pool of this module
(:data:`AUTH_THREADS`), never on the one thread ``sync_to_async``'s default shares with every
WebSocket handshake; :func:`off_thread` gives each server's tool calls the same treatment on
its own pool.

Authentication is :func:`authenticate` alone, through :func:`tenants.resolution.caller_resolve`:
an API token (``ap_…``, any endpoint), or an OAuth access token the platform issued for this
endpoint (``oauth_server``: bound to one membership and to the endpoint as its RFC 8707
resource; refused at the other endpoint). :func:`www_authenticate` writes the 401's challenge,
RFC 9728's ``resource_metadata`` pointer from which OAuth clients discover the rest.
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from asgiref.sync import sync_to_async

AUTH_THROTTLE_SCOPE: Final[str] = "mcp_auth"
"""Failed token checks per client address: ``API_THROTTLE_RATES["mcp_auth.ip"]``."""
AUTH_THREADS: Final[int] = 2
"""Threads for the token checks (one database query and a cache read each), shared by the MCP
servers of one web process."""

R = TypeVar("R")

_auth_pool = ThreadPoolExecutor(max_workers=AUTH_THREADS, thread_name_prefix="mcp-auth")


async def off_thread(pool: ThreadPoolExecutor, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` on a thread of ``pool``, its database connection handled as Channels'
    ``database_sync_to_async`` does (``close_old_connections`` before and after: with the
    connection pool, it goes back to the pool). Not the shared thread of ``sync_to_async``'s
    default (``thread_sensitive=True``), which authenticates every WebSocket."""
    from django.db import close_old_connections

    def call() -> R:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return await sync_to_async(call, thread_sensitive=False, executor=pool)()


@dataclass(frozen=True, slots=True)
class Login:
    """What :func:`authenticate` decided."""

    caller: Any
    """The credential's :class:`tenants.resolution.Caller` (with a membership), or None (no such
    token, revoked, or no membership)."""
    retry_after: float | None = None
    """Seconds the client address must wait (too many failed logins); the token was not looked at."""


def authenticate(raw_token: str, address: str, path: str) -> Login:
    """The one authentication step of the MCP servers: ``raw_token`` (the bearer credential) for
    a request from ``address`` to the endpoint ``path`` (an OAuth access token is good only at
    the endpoint it was issued for; an API token anywhere). Refused unseen when the address is over its failed-login budget
    (``mcp_auth.ip``); a failure is counted. Blocking (cache, ORM).

    Returns:
        :class:`Login`: the caller (an API token's membership decides the tenant), or None with
        ``retry_after`` when the address must wait, or None alone for a bad credential.
    """
    from tenants.resolution import caller_resolve
    from tenants.throttling import failure_record, failures_wait

    wait = failures_wait(scope=AUTH_THROTTLE_SCOPE, address=address)
    if wait is not None:
        return Login(caller=None, retry_after=wait)
    caller = caller_resolve(raw_token=raw_token, resource_path=path)
    if caller is None or caller.membership is None:
        failure_record(scope=AUTH_THROTTLE_SCOPE, address=address)
        return Login(caller=None)
    return Login(caller=caller)


def www_authenticate(path: str, base_url: str) -> str:
    """The ``WWW-Authenticate`` challenge of a 401 at the MCP endpoint ``path`` reached at
    ``base_url`` (``scheme://host``): RFC 9728's pointer to the endpoint's protected-resource
    metadata (``oauth_server``: ``/.well-known/oauth-protected-resource/mcp/<name>/``), on the
    origin ``settings.OAUTH_ISSUER`` names, else ``base_url``. An OAuth client (the MCP
    authorization spec) discovers the authorization server from there."""
    from django.conf import settings

    origin = (getattr(settings, "OAUTH_ISSUER", "") or base_url).rstrip("/")
    mount = path if path.endswith("/") else f"{path}/"
    return f'Bearer resource_metadata="{origin}/.well-known/oauth-protected-resource{mount}"'


def bearer(scope: dict[str, Any]) -> str:
    """The bearer credential of an ASGI HTTP ``scope``'s ``Authorization`` header ('' for none
    or another scheme)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            parts = value.decode("latin-1").split(None, 1)
            if len(parts) == 2 and parts[0].lower() == "bearer":
                return parts[1].strip()
            return ""
    return ""


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def refuse(send: Any, status: int, message: str, headers: list[tuple[str, str]],
                 extra: dict[str, Any] | None = None) -> None:
    """Answer ``{message, extra}`` with ``status`` and ``headers`` (the security headers and
    any of the status's own)."""
    body = json.dumps({"message": message, "extra": extra or {}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *_encoded(headers)]})
    await send({"type": "http.response.body", "body": body})


def with_headers(send: Any, headers: list[tuple[str, str]]) -> Any:
    """``send`` that adds ``headers`` to the response's start (those it does not set itself)."""
    added = _encoded(headers)

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            message = {**message, "headers": [*message.get("headers", []),
                                              *[(n, v) for n, v in added if n not in present]]}
        await send(message)

    return sending


@dataclass(frozen=True, slots=True)
class McpRequest:
    """One authenticated request to an MCP endpoint, as :func:`serve` hands it to the server."""

    caller: Any
    """The :class:`tenants.resolution.Caller` (its membership set)."""
    address: str
    """The client's address (``REMOTE_ADDR``)."""
    base_url: str
    """The origin the client reached, ``scheme://host`` (the ``Host`` checked against
    ``ALLOWED_HOSTS``): where links the server gives (the chat app) point."""
    send: Any
    """The ASGI ``send`` that adds the security headers."""


Handler = Callable[[McpRequest, dict[str, Any], Any], Awaitable[None]]
"""A server's own part: ``handler(request, scope, receive)`` answers through ``request.send``."""


async def serve(scope: dict[str, Any], receive: Any, send: Any, *, path: str, handler: Handler) -> None:
    """Answer one HTTP request to the MCP endpoint ``path``: the checks of this module's
    docstring in order, then ``handler``. Every answer carries Django's security headers."""
    from django.core.exceptions import DisallowedHost
    from django.core.handlers.asgi import ASGIRequest

    from agent_platform.security_headers import security_headers_for

    request = ASGIRequest(scope, io.BytesIO())
    headers = security_headers_for(request)
    try:
        host = request.get_host()
    except DisallowedHost as exc:
        logging.getLogger("django.security.DisallowedHost").warning("%s", exc)  # as Django logs it
        await refuse(send, 400, "Invalid Host header.", headers)
        return
    if request.method != "POST":
        await refuse(send, 405, "Only POST: this MCP server is stateless and opens no stream.",
                     [*headers, ("Allow", "POST")])
        return
    raw = bearer(scope)
    base_url = f"{request.scheme}://{host}"
    challenge = ("WWW-Authenticate", www_authenticate(path, base_url))
    if not raw:
        await refuse(send, 401, "Authentication credentials were not provided: send 'Authorization: Bearer <API "
                     "token or OAuth access token>'.", [*headers, challenge])
        return
    address = request.META.get("REMOTE_ADDR") or ""
    login = await off_thread(_auth_pool, authenticate, raw, address, path)
    if login.retry_after is not None:
        seconds = max(1, math.ceil(login.retry_after))
        await refuse(send, 429, f"Too many failed logins from this address: try again in {seconds} s.",
                     [*headers, ("Retry-After", str(seconds))], extra={"retry_after": seconds})
        return
    if login.caller is None:
        await refuse(send, 401, "Invalid or revoked token.", [*headers, challenge])
        return
    if request.content_type != "application/json":
        await refuse(send, 415, "Send the JSON-RPC message as 'Content-Type: application/json'.", headers,
                     extra={"content_type": request.content_type})
        return
    mcp_request = McpRequest(caller=login.caller, address=address, base_url=base_url,
                             send=with_headers(send, headers))
    await handler(mcp_request, scope, receive)


def handles(path: str, mount: str) -> bool:
    """True for the paths the endpoint ``mount`` (``/mcp/x/``) answers: with or without the
    trailing slash."""
    return path == mount or path == mount.rstrip("/")
