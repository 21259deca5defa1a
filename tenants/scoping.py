"""Tenant scoping: the one place it is enforced.

A ContextVar holds the current tenant id. Every tenant-owned model gets
:class:`TenantScopedManager` as ``objects``, which **fails closed**: without a tenant in
context it raises :class:`TenantScopeError` instead of returning every tenant's rows.

The context is set at exactly three kinds of entry point:
- API views: ``tenants.api.mixins.TenantScopedApiMixin.initial()`` (after authentication and
  the membership check);
- WebSocket consumers: on connect, after authenticating the scope;
- Celery tasks and the runner: ``with tenant_scope(run.tenant_id):`` / ``@with_tenant_scope``.

Bypasses have loud names: ``Model.all_tenants`` (admin, migrations, ``tenants/``) and
``Model.objects.unscoped()``; any other use needs a ``# tenant-bypass:`` comment saying why.
Known gaps (as in PostHog's scoping README): ``_base_manager`` (used for forward relation
access such as ``run.session``), raw SQL and ``prefetch_related`` are not filtered.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from typing import Any, Callable, Iterator, TypeVar

from django.db import models

_current_tenant_id: ContextVar[int | None] = ContextVar("current_tenant_id", default=None)

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=models.Model)


class TenantScopeError(RuntimeError):
    """A tenant-owned table was queried with no tenant in context."""


def current_tenant_id() -> int | None:
    """The tenant id in context, or None outside any tenant scope."""
    return _current_tenant_id.get()


def require_tenant_id() -> int:
    """The tenant id in context (for raw SQL, which the scoped managers do not filter).

    Raises:
        TenantScopeError: no tenant in context.
    """
    tenant_id = _current_tenant_id.get()
    if tenant_id is None:
        raise TenantScopeError("no tenant in context; use tenant_scope()")
    return tenant_id


@contextlib.contextmanager
def tenant_scope(tenant_id: int) -> Iterator[None]:
    """Run the body with ``tenant_id`` as the current tenant (nestable; restored on exit)."""
    if not isinstance(tenant_id, int) or isinstance(tenant_id, bool):
        raise TypeError(f"tenant_id must be an int, got {tenant_id!r}")
    token = _current_tenant_id.set(tenant_id)
    try:
        yield
    finally:
        _current_tenant_id.reset(token)


def with_tenant_scope(func: F) -> F:
    """Decorator for tasks and functions that take a ``tenant_id`` keyword argument."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tenant_id = kwargs.get("tenant_id")
        if tenant_id is None:
            raise TenantScopeError(f"{func.__qualname__} needs a tenant_id keyword argument")
        with tenant_scope(int(tenant_id)):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class TenantScopedQuerySet(models.QuerySet[M]):
    def unscoped(self) -> "TenantScopedQuerySet[M]":
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
