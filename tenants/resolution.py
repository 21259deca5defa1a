"""Which tenant is this caller? The one answer for REST, WebSocket and SSE.

Each entry point extracts its credentials (a bearer token from a header or a query string, the
session cookie's user, a tenant choice from ``X-Tenant`` or ``?tenant=``) and asks
:func:`caller_resolve`; none decides on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenants.models import ApiToken, Membership
from tenants.selectors import api_token_authenticate, membership_for_user
from tenants.services import membership_select


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


def caller_resolve(
    *, user: Any = None, token: ApiToken | None = None, raw_token: str = "", tenant_slug: str | None = None
) -> Caller | None:
    """The caller's identity and tenant.

    Rules, the same for every entry point:

    - An API token (already authenticated, ``token``, or ``raw_token`` to authenticate here)
      acts in its own membership's tenant; a tenant choice is ignored.
    - A session user acts in the tenant they name (``tenant_slug``, from ``X-Tenant`` or
      ``?tenant=``), which is then remembered as their pick; without one, in the tenant they
      picked last, else their oldest membership (:func:`tenants.selectors.membership_for_user`).

    Args:
        user: The session's user (may be anonymous or None).
        token: An API token the caller already authenticated.
        raw_token: A bearer token to authenticate ('' for none).
        tenant_slug: The tenant the session user asks for (None or '' for their default).

    Returns:
        The :class:`Caller`, or None when ``raw_token`` is given but invalid or revoked, or when
        there is no token and no authenticated user.
    """
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
