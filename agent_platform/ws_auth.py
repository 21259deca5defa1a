"""WebSocket authentication: session cookie (the SPA) or ``?token=<API token>`` (scripts).

Adds to the scope: ``user``, ``membership_id`` and ``tenant_id`` (None when the caller has
no membership), and ``token_id`` (the API token's id; None for a cookie) so that a stream can
re-check its credential while it is open (:mod:`sessions.stream_guard`). Consumers set the
tenant scope from ``tenant_id`` on connect.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async

from tenants.resolution import caller_resolve


@database_sync_to_async
def _resolve(scope: dict[str, Any]) -> tuple[Any, int | None, int | None, int | None]:
    """(user, membership_id, tenant_id, token_id) of the handshake (:func:`tenants.resolution.
    caller_resolve`: ``?token=``, else the session cookie's user in ``?tenant=<slug>`` or their
    default tenant)."""
    from django.contrib.auth.models import AnonymousUser

    query = parse_qs(scope.get("query_string", b"").decode())
    raw = (query.get("token") or [""])[0]
    caller = caller_resolve(user=scope.get("user"), raw_token=raw, tenant_slug=(query.get("tenant") or [""])[0])
    if caller is None:
        return (AnonymousUser() if raw else scope.get("user")), None, None, None
    if caller.membership is None:
        return caller.user, None, None, None
    token_id = caller.token.pk if caller.token is not None else None
    return caller.user, caller.membership.pk, caller.membership.tenant_id, token_id


class _TenantScopeMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        user, membership_id, tenant_id, token_id = await _resolve(scope)
        scope = dict(scope, user=user, membership_id=membership_id, tenant_id=tenant_id, token_id=token_id)
        return await self.inner(scope, receive, send)


def TenantWebsocketAuthMiddleware(inner: Any) -> Any:  # noqa: N802 (named like Channels' stacks)
    """Session auth (cookie), then API-token auth and membership resolution."""
    return AuthMiddlewareStack(_TenantScopeMiddleware(inner))


async def websocket_deny(receive: Any, send: Any) -> None:
    """Refuse a WebSocket handshake (HTTP 403) in plain ASGI.

    No consumer is created, so nothing joins the channel layer waiting for a disconnect that
    a refused handshake never sends (channels' ``WebsocketDenier`` is a consumer).
    """
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


class BrowserOriginValidator:
    """Origin check for WebSockets (cross-site WebSocket hijacking protection).

    Browsers always send ``Origin``; such a handshake must come from one of
    ``settings.ALLOWED_HOSTS`` (matched as channels' ``AllowedHostsOriginValidator`` matches
    them: ``*``, ``.example.com`` for subdomains; with ``DEBUG`` and no hosts, localhost) or
    it is refused with :func:`websocket_deny`. A handshake without ``Origin`` is not a
    browser, so it carries no ambient cookie risk: it is let through without its cookies and
    must authenticate with ``?token=``.
    """

    def __init__(self, application: Any) -> None:
        from channels.security.websocket import OriginValidator
        from django.conf import settings

        allowed = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not allowed:
            allowed = ["localhost", "127.0.0.1", "[::1]"]
        self._origins = OriginValidator(application, allowed)
        self._application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origins = [value for name, value in scope.get("headers", []) if name == b"origin"]
        if not origins:
            # Never cookie-authenticate a non-browser: drop its Cookie header.
            headers = [(n, v) for n, v in scope.get("headers", []) if n != b"cookie"]
            scope = dict(scope, headers=headers)
            return await self._application(scope, receive, send)
        try:
            parsed = urlparse(origins[0].decode("latin1"))
        except UnicodeDecodeError:
            parsed = None
        if not self._origins.valid_origin(parsed):
            return await websocket_deny(receive, send)
        return await self._application(scope, receive, send)
