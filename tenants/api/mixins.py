"""Tenant context for API views: the entry point that sets the tenant scope for requests.

Every tenant-owned endpoint is a :class:`TenantScopedApiView` or :class:`TenantScopedViewSet`.
After authentication it resolves the caller's membership (the API token's; for a session
user the tenant named by the ``X-Tenant`` header (a slug), which is then remembered as the
user's last pick, else the tenant they picked last, else their oldest membership), sets the
tenant ContextVar and the audit context (:mod:`tenants.audit`) for the request and resets
them when the response is done. A caller with no membership gets 403. Objects of other
tenants are simply not in the scoped querysets, so they answer 404 with the same message as
objects that do not exist.

Every create, update and delete through :class:`TenantScopedViewSet` (the ``/admin/…``
endpoints) appends an audit event with the changed fields (secrets: only that they changed).
"""

from __future__ import annotations

from contextvars import Token
from typing import Any

from django.db import models, transaction
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import build_basic_type
from drf_spectacular.types import OpenApiTypes
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.audit import (
    Action,
    AuditContext,
    audit_record,
    context_for_request,
    enter_audit_context,
    model_snapshot,
    reset_audit_context,
    snapshot_changes,
)
from tenants.models import ApiToken, Membership
from tenants.resolution import caller_resolve
from tenants.scoping import Scope, enter_tenant, reset_scope
from tenants.throttling import throttles_check, throttles_for


class IsTenantAdmin(permissions.BasePermission):
    """Owners and admins of the request's tenant."""

    message = "Only tenant owners and admins may do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        membership: Membership | None = getattr(request, "membership", None)
        return bool(membership and membership.is_admin)


def resolve_membership(request: Request) -> Membership | None:
    """The caller's membership (:func:`tenants.resolution.caller_resolve`): the API token's,
    else (session) the ``X-Tenant`` one, which is remembered as the user's pick, else their
    default."""
    token = request.auth if isinstance(request.auth, ApiToken) else None
    caller = caller_resolve(user=request.user, token=token, tenant_slug=request.headers.get("X-Tenant"))
    return caller.membership if caller is not None else None


class TenantContextMixin:
    """Sets ``request.membership``, ``request.tenant``, the tenant scope and the audit context
    for one request."""

    _tenant_token: Token[Scope] | None = None
    _audit_token: Token[AuditContext | None] | None = None
    throttle_scopes: tuple[str, ...] = ()
    """Budgets (``settings.API_THROTTLE_RATES``) that this view's unsafe requests spend, per
    user and per tenant (:mod:`tenants.throttling`)."""

    def get_throttles(self) -> list[Any]:
        throttles = list(super().get_throttles())  # type: ignore[misc]
        if self.throttle_scopes and self.request.method not in permissions.SAFE_METHODS:  # type: ignore[attr-defined]
            throttles += throttles_for(self.throttle_scopes)
        return throttles

    def check_throttles(self, request: Request) -> None:
        """DRF's check, with the scoped throttles' counters read and written together
        (:func:`tenants.throttling.throttles_check`); 429 through DRF's ``throttled``."""
        waits = throttles_check(self.get_throttles(), request, self)
        if waits:
            self.throttled(request, max((wait for wait in waits if wait is not None), default=None))  # type: ignore[attr-defined]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self.perform_authentication(request)  # type: ignore[attr-defined]
        self._audit_token = enter_audit_context(context_for_request(request, source="api"))
        membership = resolve_membership(request)
        # Also on the Django request underneath: DRF's OPTIONS metadata builds a clone of the
        # DRF request (rest_framework.request.clone_request) that reads through to it, so a
        # view's get_queryset sees the caller there too (without it: an AttributeError, a 500).
        for target in (request, request._request):
            target.membership = membership  # type: ignore[attr-defined]
            target.tenant = membership.tenant if membership else None  # type: ignore[attr-defined]
        if membership is not None:
            self._tenant_token = enter_tenant(membership.tenant_id)
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        if membership is None:
            raise PermissionDenied("You are not a member of any tenant.")

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        finally:
            self._leave_contexts()

    def handle_exception(self, exc: Exception) -> Any:
        """An exception no handler turns into a response skips ``finalize_response``: the
        tenant scope and audit context are left here then, not leaked to the thread's next
        request (WSGI) or code after the view."""
        try:
            return super().handle_exception(exc)  # type: ignore[misc]
        except BaseException:
            self._leave_contexts()
            raise

    def _leave_contexts(self) -> None:
        if self._tenant_token is not None:
            reset_scope(self._tenant_token)
            self._tenant_token = None
        if self._audit_token is not None:
            reset_audit_context(self._audit_token)
            self._audit_token = None


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

    # create / update / destroy as DRF's mixins do them, with the write and its audit event in
    # one transaction. Subclasses customise perform_create/perform_update/perform_destroy.

    def _audit_detail(self, request: Request) -> dict[str, Any]:
        data = request.data if isinstance(request.data, dict) else {}
        return {"fields_sent": sorted(str(key)[:64] for key in list(data)[:100])}

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            self.perform_create(serializer)
            instance = serializer.instance
            audit_record(action=Action.CREATE, obj=instance, changes=snapshot_changes(None, model_snapshot(instance)),
                         detail=self._audit_detail(request))
        headers = self.get_success_headers(serializer.data)
        return Response(serializer.data, status=status.HTTP_201_CREATED, headers=headers)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        partial = kwargs.pop("partial", False)
        instance = self.get_object()
        before = model_snapshot(instance)
        serializer = self.get_serializer(instance, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            self.perform_update(serializer)
            audit_record(action=Action.UPDATE, obj=serializer.instance,
                         changes=snapshot_changes(before, model_snapshot(serializer.instance)),
                         detail=self._audit_detail(request))
        if getattr(instance, "_prefetched_objects_cache", None):
            instance._prefetched_objects_cache = {}
        return Response(serializer.data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        instance = self.get_object()
        with transaction.atomic():
            audit_record(action=Action.DELETE, obj=instance)
            self.perform_destroy(instance)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key restricted to the current tenant's rows (resolved per request).

    Another tenant's id fails validation exactly like a missing id.
    """

    def __init__(self, model: type[models.Model], **kwargs: Any) -> None:
        self.model = model
        super().__init__(**kwargs)

    def get_queryset(self) -> models.QuerySet:
        return self.model.objects.all()  # type: ignore[attr-defined]


class TenantPrimaryKeyRelatedFieldSchema(OpenApiSerializerFieldExtension):
    """OpenAPI type of a :class:`TenantPrimaryKeyRelatedField`: its model's primary key
    (``integer`` for an integer key, as every model's ``BigAutoField`` id here; else
    ``string``), also in a plain ``Serializer`` without a ``Meta.model``, where drf-spectacular
    cannot tell and warns. Registered with drf-spectacular when this module is imported."""

    target_class = TenantPrimaryKeyRelatedField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        """``{"type": "integer"}`` or ``{"type": "string"}``; drf-spectacular adds the field's
        own ``nullable`` and ``description``. Never ``readOnly``: the relation is writable."""
        integer_key = isinstance(self.target.model._meta.pk, models.IntegerField)  # AutoField, BigAutoField
        return build_basic_type(OpenApiTypes.INT if integer_key else OpenApiTypes.STR)
