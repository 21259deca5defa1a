"""Tenant context for API views: the entry point that sets the tenant scope for requests.

Every tenant-owned endpoint is a :class:`TenantScopedApiView` or :class:`TenantScopedViewSet`.
After authentication it resolves the caller's membership (the API token's; for a session
user the tenant named by the ``X-Tenant`` header (a slug), else their oldest membership),
sets the tenant ContextVar for the request and resets it when the response is done. A caller
with no membership gets 403. Objects of other tenants are simply not in the scoped querysets,
so they answer 404 with the same message as objects that do not exist.
"""

from __future__ import annotations

from contextvars import Token
from typing import Any

from django.db import models
from rest_framework import permissions, serializers, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.views import APIView

from tenants.models import ApiToken, Membership
from tenants.scoping import Scope, enter_tenant, reset_scope
from tenants.selectors import membership_for_user


class IsTenantAdmin(permissions.BasePermission):
    """Owners and admins of the request's tenant."""

    message = "Only tenant owners and admins may do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        membership: Membership | None = getattr(request, "membership", None)
        return bool(membership and membership.is_admin)


def resolve_membership(request: Request) -> Membership | None:
    if isinstance(request.auth, ApiToken):
        return request.auth.membership
    if request.user and request.user.is_authenticated:
        return membership_for_user(user=request.user, tenant_slug=request.headers.get("X-Tenant"))
    return None


class TenantContextMixin:
    """Sets ``request.membership``, ``request.tenant`` and the tenant scope for one request."""

    _tenant_token: Token[Scope] | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self.perform_authentication(request)  # type: ignore[attr-defined]
        membership = resolve_membership(request)
        request.membership = membership  # type: ignore[attr-defined]
        request.tenant = membership.tenant if membership else None  # type: ignore[attr-defined]
        if membership is not None:
            self._tenant_token = enter_tenant(membership.tenant_id)
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if membership is None:
            raise PermissionDenied("You are not a member of any tenant.")

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        finally:
            if self._tenant_token is not None:
                reset_scope(self._tenant_token)
                self._tenant_token = None


class TenantScopedApiView(TenantContextMixin, APIView):
    """Base for a tenant-owned endpoint written as one APIView per operation."""


class TenantScopedViewSet(TenantContextMixin, viewsets.ModelViewSet):
    """CRUD over one tenant-owned model, for tenant admins.

    Subclasses set ``model``; the queryset is always ``model.objects`` (scoped) and new rows
    get the request's tenant.
    """

    model: type[models.Model]
    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    def get_queryset(self) -> models.QuerySet:
        if getattr(self, "swagger_fake_view", False):  # OpenAPI generation: no request, no tenant
            return self.model.all_tenants.none()  # type: ignore[attr-defined]
        return self.model.objects.all()  # type: ignore[attr-defined]

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.save(tenant=self.request.tenant)  # type: ignore[attr-defined]


class TenantPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key restricted to the current tenant's rows (resolved per request).

    Another tenant's id fails validation exactly like a missing id.
    """

    def __init__(self, model: type[models.Model], **kwargs: Any) -> None:
        self.model = model
        super().__init__(**kwargs)

    def get_queryset(self) -> models.QuerySet:
        return self.model.objects.all()  # type: ignore[attr-defined]
