"""Reads for tenants and memberships (cross-tenant by nature: they decide the tenant)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone

from tenants.models import ADMIN_ROLES, ApiToken, Membership
from tenants.scoping import system_scope
from tenants.services import token_hash


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """The live token for ``raw``, or None (unknown, revoked or its user inactive).

    Touches ``last_used_at`` at most once a minute.
    """
    # tenant-bypass: the token decides the tenant.
    with system_scope():
        token = (
            ApiToken.all_tenants.select_related("membership__user", "membership__tenant")
            .filter(token_hash=token_hash(raw), revoked_at__isnull=True)
            .first()
        )
        if token is None or not token.membership.user.is_active:
            return None
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
            ApiToken.all_tenants.filter(pk=token.pk).update(last_used_at=now)
    return token


def membership_for_user(
    *, user: AbstractBaseUser | AnonymousUser, tenant_slug: str | None = None
) -> Membership | None:
    """The user's membership in ``tenant_slug``, else their first (oldest) one; None if none."""
    if not user.is_authenticated:
        return None
    # tenant-bypass: the membership decides the tenant.
    qs = Membership.all_tenants.select_related("tenant").filter(user=user).order_by("created_at", "id")
    if tenant_slug:
        qs = qs.filter(tenant__slug=tenant_slug)
    with system_scope():
        return qs.first()


def admin_tenant_ids(*, user: AbstractBaseUser) -> list[int]:
    """Ids of the tenants where ``user`` is an owner or admin."""
    # tenant-bypass: lists the user's own memberships.
    with system_scope():
        return list(
            Membership.all_tenants.filter(user=user, role__in=list(ADMIN_ROLES)).values_list("tenant_id", flat=True)
        )
