"""An OAuth access token → the :class:`tenants.resolution.Caller` of its grant's membership.

Filled into :func:`tenants.resolution.bearer_resolver_set` by this app's ``ready()``; the MCP
servers' edge (:func:`agent_platform.mcp_http.authenticate`) asks
:func:`tenants.resolution.caller_resolve` with the endpoint's path.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from urllib.parse import urlsplit

from django.utils import timezone
from oauth2_provider.models import get_access_token_model

from oauth_server.models import McpGrant
from oauth_server.resources import mount_of
from tenants.resolution import Caller
from tenants.scoping import system_scope


def _audience_mount(resources: list[str] | None) -> str | None:
    """The MCP mount a token's single RFC 8707 resource names, or None (none, several, other)."""
    if not resources or len(resources) != 1 or not isinstance(resources[0], str):
        return None
    return mount_of(urlsplit(resources[0]).path)


def oauth_caller(raw_token: str, path: str) -> Caller | None:
    """The caller an OAuth access token acts as at the MCP endpoint ``path``.

    Args:
        raw_token: The bearer credential (not an ``ap_`` API token).
        path: The request's path (``/mcp/agents/`` or ``/mcp/knowledge/``, slash optional).

    Returns:
        ``Caller(user, membership)`` of the token's :class:`McpGrant`, or None when the token is
        unknown, expired or revoked, its audience (RFC 8707 resource) is another endpoint, its
        grant was revoked or its membership deleted, or its user is inactive. Blocking (ORM);
        touches the grant's ``last_used_at`` at most once a minute.
    """
    mount = mount_of(path)
    if mount is None:
        return None
    checksum = hashlib.sha256(raw_token.encode("utf-8")).hexdigest()
    token = (
        get_access_token_model()
        .objects.select_related("refresh_token")
        .filter(token_checksum=checksum, expires__gt=timezone.now())
        .first()
    )
    if token is None or _audience_mount(token.resource) != mount:
        return None
    refresh = getattr(token, "refresh_token", None)
    if refresh is None or refresh.token_family is None or refresh.revoked is not None:
        return None
    # tenant-bypass: the token decides the tenant (its grant's membership).
    with system_scope():
        grant = (
            McpGrant.all_tenants.select_related("membership__user", "membership__tenant")
            .filter(token_family=refresh.token_family, application_id=token.application_id)
            .first()
        )
        if grant is None or grant.membership.user_id != token.user_id or not grant.membership.user.is_active:
            return None
        now = timezone.now()
        if grant.last_used_at is None or now - grant.last_used_at > timedelta(minutes=1):
            McpGrant.all_tenants.filter(pk=grant.pk).update(last_used_at=now)
    return Caller(user=grant.membership.user, membership=grant.membership, oauth_grant_id=grant.pk)
