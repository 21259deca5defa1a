"""WebSocket authentication: session cookie (the SPA) or ``?token=<API token>`` (scripts).

Adds to the scope: ``user``, ``membership_id`` and ``tenant_id`` (None when the caller has
no membership). Consumers set the tenant scope from ``tenant_id`` on connect.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async

from tenants.selectors import api_token_authenticate, membership_for_user


@database_sync_to_async
def _resolve(scope: dict[str, Any]) -> tuple[Any, int | None, int | None]:
    query = parse_qs(scope.get("query_string", b"").decode())
    raw = (query.get("token") or [""])[0]
    if raw:
        token = api_token_authenticate(raw=raw)
        if token is None:
            from django.contrib.auth.models import AnonymousUser

            return AnonymousUser(), None, None
        return token.membership.user, token.membership_id, token.membership.tenant_id
    user = scope.get("user")
    membership = membership_for_user(user=user) if user is not None else None
    if membership is None:
        return user, None, None
    return user, membership.pk, membership.tenant_id


class _TenantScopeMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        user, membership_id, tenant_id = await _resolve(scope)
        scope = dict(scope, user=user, membership_id=membership_id, tenant_id=tenant_id)
        return await self.inner(scope, receive, send)


def TenantWebsocketAuthMiddleware(inner: Any) -> Any:  # noqa: N802 (named like Channels' stacks)
    """Session auth (cookie), then API-token auth and membership resolution."""
    return AuthMiddlewareStack(_TenantScopeMiddleware(inner))


class BrowserOriginValidator:
    """Origin check for WebSockets (cross-site WebSocket hijacking protection).

    Browsers always send ``Origin``; such a handshake must come from one of
    ``settings.ALLOWED_HOSTS`` (or an explicitly allowed extension origin). A handshake
    without ``Origin`` is not a browser, so it carries no ambient cookie risk: it is let
    through and must authenticate with ``?token=``.
    """

    def __init__(self, application: Any) -> None:
        from channels.security.websocket import AllowedHostsOriginValidator

        self._checked = AllowedHostsOriginValidator(application)
        self._application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        has_origin = any(name == b"origin" for name, _ in scope.get("headers", []))
        if not has_origin:
            # Never cookie-authenticate a non-browser: drop its Cookie header.
            headers = [(n, v) for n, v in scope.get("headers", []) if n != b"cookie"]
            scope = dict(scope, headers=headers)
            return await self._application(scope, receive, send)
        return await self._checked(scope, receive, send)
