"""Which tenant is this caller? The one answer for REST, WebSocket and SSE.

Each entry point extracts its credentials (a bearer token from a header or a query string, the
session cookie's user, a tenant choice from ``X-Tenant`` or ``?tenant=``) and asks
:func:`caller_resolve`; none decides on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenants.models import ApiToken, Membership
from tenants.selectors import api_token_authenticate, membership_for_user
from tenants.services import TOKEN_PREFIX, membership_select


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, and in which tenant."""

    user: Any
    """The authenticated user (the token's user for a token)."""
    membership: Membership | None
    """The membership the call acts in; None for a user with no membership (or none in the
    tenant they asked for)."""
    token: ApiToken | None = None
    """The API token when the call authenticated with one (it decides the tenant alone)."""
    oauth_grant_id: int | None = None
    """The OAuth grant (``oauth_server.McpGrant``) when the call authenticated with an OAuth
    access token (its membership decides the tenant)."""

    @property
    def credential_key(self) -> str:
        """Names the credential the call authenticated with: ``token:<id>``, ``oauth:<grant id>``
        or ``user:<id>`` (a session): for keys that only the same credential may find again."""
        if self.token is not None:
            return f"token:{self.token.pk}"
        if self.oauth_grant_id is not None:
            return f"oauth:{self.oauth_grant_id}"
        return f"user:{getattr(self.user, 'pk', '')}"


BearerResolver = Callable[[str, str], "Caller | None"]
"""``resolver(raw_token, resource_path)``: the caller of a bearer credential that is not an API
token (an OAuth access token for an MCP endpoint), or None."""

_bearer_resolvers: list[BearerResolver] = []


def bearer_resolver_set(resolver: BearerResolver) -> None:
    """Fill the port for bearer credentials that are not API tokens: the OAuth server's
    access tokens (``oauth_server``'s ``ready()``). Set once; a second call replaces it."""
    _bearer_resolvers[:] = [resolver]


def caller_resolve(
    *,
    user: Any = None,
    token: ApiToken | None = None,
    raw_token: str = "",
    tenant_slug: str | None = None,
    resource_path: str = "",
) -> Caller | None:
    """The caller's identity and tenant.

    Rules, the same for every entry point:

    - An API token (already authenticated, ``token``, or ``raw_token`` to authenticate here)
      acts in its own membership's tenant; a tenant choice is ignored.
    - Another ``raw_token`` (not ``ap_…``) with a ``resource_path``: an OAuth access token,
      resolved by the port :func:`bearer_resolver_set` fills; it acts in its grant's
      membership, and only at the resource (MCP endpoint) it was issued for.
    - A session user acts in the tenant they name (``tenant_slug``, from ``X-Tenant`` or
      ``?tenant=``), which is then remembered as their pick; without one, in the tenant they
      picked last, else their oldest membership (:func:`tenants.selectors.membership_for_user`).

    Args:
        user: The session's user (may be anonymous or None).
        token: An API token the caller already authenticated.
        raw_token: A bearer token to authenticate ('' for none).
        tenant_slug: The tenant the session user asks for (None or '' for their default).
        resource_path: The path of the endpoint called, for OAuth access tokens ('' refuses them).

    Returns:
        The :class:`Caller`, or None when ``raw_token`` is given but invalid or revoked, or when
        there is no token and no authenticated user.
    """
    if raw_token and not raw_token.startswith(TOKEN_PREFIX):
        if not resource_path or not _bearer_resolvers:
            return None
        return _bearer_resolvers[0](raw_token, resource_path)
    if raw_token:
        token = api_token_authenticate(raw=raw_token)
        if token is None:
            return None
    if token is not None:
        return Caller(user=token.membership.user, membership=token.membership, token=token)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    membership = membership_for_user(user=user, tenant_slug=tenant_slug or None)
    if tenant_slug and membership is not None:
        membership_select(membership=membership)
    return Caller(user=user, membership=membership)
