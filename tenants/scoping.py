"""Tenant scoping: the one place it is enforced.

A ContextVar (:mod:`tenants.context`) holds the current tenant id. Every tenant-owned model gets
:class:`TenantScopedManager` as ``objects``, which **fails closed**: without a tenant in
context it raises :class:`TenantScopeError` instead of returning every tenant's rows.

The context is set at the entry points only:
- API views: ``tenants.api.mixins.TenantContextMixin.initial()`` (after authentication and
  the membership check);
- WebSocket consumers: on connect, after authenticating the scope;
- Celery tasks and the runner: ``with tenant_scope(run.tenant_id):`` / ``@with_tenant_scope``;
- the console: ``tenants.middleware.ConsoleScopeMiddleware``;
- the sweeper and management commands: :func:`system_scope`.

Bypasses have loud names: ``Model.all_tenants`` (admin, migrations, ``tenants/``) and
``Model.objects.unscoped()``; any other use needs a ``# tenant-bypass:`` comment saying why.
Known gaps of the ORM layer (as in PostHog's scoping README): ``_base_manager`` (used for
forward relation access such as ``run.session``), raw SQL and ``prefetch_related`` are not
filtered here. PostgreSQL closes them: the same context decides what the connection may see
(row-level security, :mod:`tenants.rls`), so a query that escapes the ORM's filter still
gets only the tenant's rows. For that layer the context has two more values:
:func:`system_scope` (every tenant: the sweeper, a superuser's console, management commands,
lookups that decide the tenant) and :func:`tenants_scope` (several tenants: a console user
who administers more than one). Outside any scope the database shows no tenant-owned row.
"""

from __future__ import annotations

from typing import TypeVar

from django.db import models

from tenants.context import (  # noqa: F401  (the scope's API, re-exported)
    ALL_TENANTS,
    Scope,
    TenantScopeError,
    current_scope,
    current_tenant_id,
    enter_tenant,
    outside_scope,
    require_tenant_id,
    reset_scope,
    system_scope,
    tenant_scope,
    tenants_scope,
    with_tenant_scope,
)

M = TypeVar("M", bound=models.Model)


class TenantScopedQuerySet(models.QuerySet[M]):
    def unscoped(self) -> TenantScopedQuerySet[M]:
        """Every tenant's rows. Needs a ``# tenant-bypass:`` comment at the call site."""
        return self.model.all_tenants.all()  # type: ignore[attr-defined]


class TenantScopedManager(models.Manager[M]):
    """Filters every query by the tenant in context; raises without one."""

    def get_queryset(self) -> TenantScopedQuerySet[M]:
        tenant_id = current_tenant_id()
        if tenant_id is None:
            raise TenantScopeError(
                f"No tenant context for {self.model.__name__}; use tenant_scope() or .all_tenants"
            )
        return TenantScopedQuerySet(self.model, using=self._db).filter(tenant_id=tenant_id)

    def unscoped(self) -> models.QuerySet[M]:
        """Every tenant's rows. Needs a ``# tenant-bypass:`` comment at the call site."""
        return models.QuerySet(self.model, using=self._db)


class TenantOwnedModel(models.Model):
    """Base for every row that belongs to a tenant.

    ``objects`` is scoped and fails closed; ``all_tenants`` is the explicit bypass and the
    default manager (so the admin, ``prefetch_related`` and migrations keep working).
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")

    objects = TenantScopedManager()
    all_tenants = models.Manager()

    class Meta:
        abstract = True
        default_manager_name = "all_tenants"
        base_manager_name = "all_tenants"
