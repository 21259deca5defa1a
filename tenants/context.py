"""The tenant scope of the running code: one ContextVar, read by both layers of tenancy.

:mod:`tenants.scoping` (the ORM's scoped managers) and :mod:`tenants.rls` (PostgreSQL's
row-level security) both decide what a query may see from this context. It lives apart from
them because the database backend (``agent_platform.postgresql``) needs it before any model
is defined. Import these names from :mod:`tenants.scoping`, which re-exports them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from agent_platform.telemetry import current_span_tenant

F = TypeVar("F", bound=Callable[..., Any])


class _AllTenants:
    def __repr__(self) -> str:
        return "ALL_TENANTS"


ALL_TENANTS = _AllTenants()
"""The scope of :func:`system_scope`."""

Scope = int | frozenset[int] | _AllTenants | None
_current_scope: ContextVar[Scope] = ContextVar("current_tenant_scope", default=None)


class TenantScopeError(RuntimeError):
    """A tenant-owned table was queried with no tenant in context."""


def current_tenant_id() -> int | None:
    """The tenant id in context, or None outside a single tenant's scope (also in
    :func:`system_scope` and :func:`tenants_scope`)."""
    scope = _current_scope.get()
    return scope if isinstance(scope, int) else None


def current_scope() -> Scope:
    """What the context may see: a tenant id, a frozenset of tenant ids, :data:`ALL_TENANTS`,
    or None (nothing tenant-owned)."""
    return _current_scope.get()


def enter_tenant(tenant_id: int) -> Token[Scope]:
    """Make ``tenant_id`` the current tenant until :func:`reset_scope` (for entry points whose
    start and end are two calls, such as a DRF view's ``initial``/``finalize_response``)."""
    token = _current_scope.set(_checked(tenant_id))
    current_span_tenant(tenant_id)  # the request's span, started before its tenant was known (if tracing)
    return token


def reset_scope(token: Token[Scope]) -> None:
    """Undo the :func:`enter_tenant` (or other scope change) that returned ``token``."""
    _current_scope.reset(token)


def require_tenant_id() -> int:
    """The tenant id in context (for raw SQL, which the scoped managers do not filter).

    Raises:
        TenantScopeError: no tenant in context.
    """
    tenant_id = current_tenant_id()
    if tenant_id is None:
        raise TenantScopeError("no tenant in context; use tenant_scope()")
    return tenant_id


def _checked(tenant_id: int) -> int:
    if not isinstance(tenant_id, int) or isinstance(tenant_id, bool):
        raise TypeError(f"tenant_id must be an int, got {tenant_id!r}")
    return tenant_id


@contextlib.contextmanager
def _scoped(scope: Scope) -> Iterator[None]:
    token = _current_scope.set(scope)
    try:
        yield
    finally:
        _current_scope.reset(token)


def tenant_scope(tenant_id: int) -> contextlib.AbstractContextManager[None]:
    """Run the body with ``tenant_id`` as the current tenant (nestable; restored on exit).

    Raises:
        TypeError: ``tenant_id`` is not an int.
    """
    current_span_tenant(_checked(tenant_id))  # a task's span, started before its tenant was known (if tracing)
    return _scoped(tenant_id)


def system_scope() -> contextlib.AbstractContextManager[None]:
    """Run the body with every tenant's rows visible to the database (row-level security
    off for it; the scoped managers still raise: use ``all_tenants``). For code that works
    across tenants by design: the sweeper, a superuser's console, management commands, and
    the lookups that decide a request's tenant (a token, a membership, a run id). Querysets
    are lazy: evaluate them inside the block. A :func:`tenant_scope` inside narrows again."""
    return _scoped(ALL_TENANTS)


def outside_scope() -> contextlib.AbstractContextManager[None]:
    """Run the body in no scope at all (the scoped managers raise; the database shows no
    tenant-owned row), whatever the caller's: for tests of what code does unscoped."""
    return _scoped(None)


def tenants_scope(tenant_ids: Iterable[int]) -> contextlib.AbstractContextManager[None]:
    """Run the body with the rows of ``tenant_ids`` visible to the database (the console of
    a user who administers several tenants; an empty set shows nothing). The scoped managers
    raise here, as outside any scope.

    Raises:
        TypeError: an id is not an int.
    """
    ids = frozenset(tenant_ids)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise TypeError(f"tenant ids must be ints, got {sorted(ids, key=repr)!r}")
    return _scoped(ids)


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
