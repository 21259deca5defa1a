"""Reads for tenants and memberships (cross-tenant by nature: they decide the tenant)."""

from __future__ import annotations

import functools
from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection
from django.db.models import F, QuerySet
from django.utils import timezone

from agent_platform.model_rows import joined_instances, select_columns_sql
from tenants.models import ADMIN_ROLES, ApiToken, AuditEvent, Invitation, Membership
from tenants.scoping import system_scope


@functools.cache
def _token_models() -> tuple[type, ...]:
    """The models of a token lookup's row, in its order: the token, its membership, user, tenant."""
    return (ApiToken, Membership, Membership._meta.get_field("user").related_model,
            Membership._meta.get_field("tenant").related_model)


@functools.cache
def _token_lookup_sql() -> str:
    """The live token by its hash, with its membership, user and tenant: one row of
    :func:`_token_models`' columns (:mod:`agent_platform.model_rows`)."""
    token_t, member_t, user_t, tenant_t = (m._meta.db_table for m in _token_models())
    membership_fk = ApiToken._meta.get_field("membership").column
    user_fk, tenant_fk = Membership._meta.get_field("user").column, Membership._meta.get_field("tenant").column
    columns = ", ".join(select_columns_sql(m, qualified=True) for m in _token_models())
    return (
        f'SELECT {columns} FROM "{token_t}" '
        f'INNER JOIN "{member_t}" ON "{member_t}"."id" = "{token_t}"."{membership_fk}" '
        f'INNER JOIN "{user_t}" ON "{user_t}"."id" = "{member_t}"."{user_fk}" '
        f'INNER JOIN "{tenant_t}" ON "{tenant_t}"."id" = "{member_t}"."{tenant_fk}" '
        f'WHERE "{token_t}"."token_hash" = %s AND "{token_t}"."revoked_at" IS NULL'
    )


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """The live token for ``raw``, with its membership, user and tenant loaded, or None
    (unknown, revoked or its user inactive).

    One hand-written statement (:func:`_token_lookup_sql`), not a queryset: every API request
    with a token and every stream's opening makes this lookup, and Django built and compiled
    the ``select_related`` queryset's SQL (36 columns, three joins) anew each time, ~1 ms of CPU
    on a 2-vCPU machine, this ~0.35 ms (bench/request_lookups.py).
    Touches ``last_used_at`` at most once a minute.
    """
    from tenants.services import token_hash  # services import the API error classes (DRF): not at import time

    # tenant-bypass: the token decides the tenant.
    with system_scope():
        with connection.cursor() as cursor:  # (a Django cursor: it applies the system scope)
            cursor.execute(_token_lookup_sql(), [token_hash(raw)])
            row = cursor.fetchone()
        if row is None:
            return None
        token, membership, user, tenant = joined_instances(_token_models(), row)
        membership.user, membership.tenant = user, tenant
        token.membership = membership
        if not user.is_active:
            return None
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
            ApiToken.all_tenants.filter(pk=token.pk).update(last_used_at=now)
    return token


def membership_for_user(
    *, user: AbstractBaseUser | AnonymousUser, tenant_slug: str | None = None
) -> Membership | None:
    """The user's membership in ``tenant_slug``; without a slug their default one: the tenant
    they picked last (``Membership.last_selected_at``), else their oldest membership. None if
    none (or not a member of ``tenant_slug``).

    The one place a session user's tenant is decided (API views, the SPA's login, WebSocket
    and SSE authentication).
    """
    if not user.is_authenticated:
        return None
    # tenant-bypass: the membership decides the tenant.
    qs = Membership.all_tenants.select_related("tenant").filter(user=user).order_by(
        F("last_selected_at").desc(nulls_last=True), "created_at", "id")
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


def membership_list_for_user(*, user: AbstractBaseUser) -> list[Membership]:
    """Every membership of ``user`` (with its tenant), default first (as :func:`membership_for_user`)."""
    # tenant-bypass: the user's own memberships, across their tenants.
    with system_scope():
        return list(Membership.all_tenants.select_related("tenant").filter(user=user).order_by(
            F("last_selected_at").desc(nulls_last=True), "created_at", "id"))


def invitation_list(*, pending_only: bool = False) -> QuerySet[Invitation]:
    """The current tenant's invitations, newest first. Requires tenant scope."""
    qs = Invitation.objects.select_related("created_by", "accepted_by")
    if pending_only:
        qs = qs.filter(accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())
    return qs


def audit_event_list(*, action: str | None = None, actor_id: int | None = None,
                     object_type: str | None = None) -> QuerySet[AuditEvent]:
    """The current tenant's audit events, newest first, optionally filtered by ``action``,
    acting user id and ``object_type`` (``app_label.model``). Requires tenant scope: events of
    other tenants, and events of no tenant, are never in it."""
    qs = AuditEvent.objects.all()
    if action:
        qs = qs.filter(action=action)
    if actor_id is not None:
        qs = qs.filter(actor_id=actor_id)
    if object_type:
        qs = qs.filter(object_type=object_type)
    return qs.order_by("-at", "-id")
