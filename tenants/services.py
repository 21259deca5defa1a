"""Writes for tenants, memberships and API tokens."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.contrib.auth.models import AbstractUser
from django.db import transaction
from django.utils import timezone

from tenants.crypto import data_key_new_wrapped
from tenants.models import ApiToken, Membership, Role, Tenant

TOKEN_PREFIX = "ap_"


def token_hash(raw: str) -> str:
    """SHA-256 hex digest of a raw token (what is stored and looked up)."""
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def tenant_create(*, name: str, slug: str) -> Tenant:
    """Create a tenant with a fresh wrapped data key."""
    tenant = Tenant(name=name, slug=slug, wrapped_data_key=data_key_new_wrapped())
    tenant.full_clean()
    tenant.save()
    return tenant


@transaction.atomic
def membership_create(*, tenant: Tenant, user: AbstractUser, role: str = Role.MEMBER) -> Membership:
    membership = Membership(tenant=tenant, user=user, role=role)
    membership.full_clean()
    membership.save()
    return membership


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str
    """The token itself: shown once, never stored."""


@transaction.atomic
def api_token_create(*, membership: Membership, name: str = "") -> IssuedToken:
    """Issue a bearer token for ``membership``.

    Returns:
        The row and the raw token ``ap_<43 urlsafe chars>`` (256 bits of randomness); only
        its SHA-256 is stored.
    """
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.all_tenants.create(
        tenant_id=membership.tenant_id,
        membership=membership,
        name=name,
        prefix=raw[:10],
        token_hash=token_hash(raw),
    )
    return IssuedToken(token=token, raw=raw)


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token; it is refused from the next request on. Idempotent."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
