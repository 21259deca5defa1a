"""The console (Django admin) seen by tenant admins: only their tenants' rows.

A superuser sees everything. A staff user who is owner/admin of one or more tenants sees and
edits only those tenants' rows, may only pick foreign keys within them (users: only users
with a membership in them), and needs no Django model permissions (the membership role is
the permission). Everyone else sees nothing.

Every add, change and delete through these classes is recorded in the audit log
(:class:`tenants.audit.AuditedModelAdminMixin`).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import models
from django.http import HttpRequest

from tenants.audit import AuditedModelAdminMixin
from tenants.models import Membership, Tenant
from tenants.selectors import admin_tenant_ids


def admin_tenants(request: HttpRequest) -> list[int]:
    """Ids of the tenants the request's user administers (empty when signed out), cached on the request.

    The admin pages of every app scope their querysets and choices with it.
    """
    cached = getattr(request, "_admin_tenant_ids", None)
    if cached is None:
        cached = admin_tenant_ids(user=request.user) if request.user.is_authenticated else []
        request._admin_tenant_ids = cached  # type: ignore[attr-defined]
    return cached


def users_of_tenants(tenant_ids: list[int]) -> models.QuerySet:
    """Users with a membership in one of ``tenant_ids`` (what a tenant admin may pick)."""
    User = get_user_model()
    # tenant-bypass: memberships of the admin's own tenants (the console scope allows them too).
    member_ids = Membership.all_tenants.filter(tenant_id__in=tenant_ids).values("user_id")
    return User._default_manager.filter(pk__in=member_ids)


def _limited_foreign_key(db_field: Any, request: HttpRequest, kwargs: dict[str, Any]) -> None:
    related = db_field.related_model
    if request.user.is_superuser:
        return
    if related is Tenant:
        kwargs["queryset"] = Tenant.objects.filter(pk__in=admin_tenants(request))
    elif related is get_user_model():
        kwargs["queryset"] = users_of_tenants(admin_tenants(request))
    elif hasattr(related, "all_tenants"):
        kwargs["queryset"] = related.all_tenants.filter(tenant_id__in=admin_tenants(request))


class TenantScopedModelAdmin(AuditedModelAdminMixin, admin.ModelAdmin):
    """Base ModelAdmin for tenant-owned models (writes audited)."""

    read_only_model = False

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        qs = self.model.all_tenants.all()  # tenant-bypass: filtered just below
        if request.user.is_superuser:
            return qs
        return qs.filter(tenant_id__in=admin_tenants(request))

    def _allowed(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff and (
            request.user.is_superuser or bool(admin_tenants(request))
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self._allowed(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request) and (obj is None or self._owns(request, obj))

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return not self.read_only_model and self._allowed(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not self.read_only_model and self.has_view_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self.read_only_model and not request.user.is_superuser:
            return False
        return self.has_view_permission(request, obj)

    def _owns(self, request: HttpRequest, obj: Any) -> bool:
        return request.user.is_superuser or obj.tenant_id in admin_tenants(request)

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        exclude = list(super().get_exclude(request, obj) or [])
        if not request.user.is_superuser and len(admin_tenants(request)) == 1:
            exclude.append("tenant")
        return exclude

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The admin's ``fields`` (or the form's) without the excluded ones: an explicit
        ``fields`` naming ``tenant`` would otherwise ask the form for a field
        :meth:`get_exclude` took out (a KeyError, a 500, for an admin of one tenant)."""
        exclude = set(self.get_exclude(request, obj) or [])
        return [f for f in super().get_fields(request, obj) if f not in exclude]

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        _limited_foreign_key(db_field, request, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The form; when the tenant is not a field (an admin of one tenant), a new row gets that
        tenant before the form validates, so the model's ``clean`` checks what depends on the
        tenant (a name already taken in it, ...) and answers with a form error, not a crash."""
        form = super().get_form(request, obj, change=change, **kwargs)
        tenants = admin_tenants(request)
        if obj is not None or request.user.is_superuser or len(tenants) != 1:
            return form
        tenant_id = tenants[0]

        class _TenantForm(form):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **form_kwargs: Any) -> None:
                super().__init__(*args, **form_kwargs)
                if hasattr(self.instance, "tenant_id") and not self.instance.tenant_id:
                    self.instance.tenant_id = tenant_id

        _TenantForm.__name__ = form.__name__
        return _TenantForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not getattr(obj, "tenant_id", None):
            obj.tenant_id = admin_tenants(request)[0]
        super().save_model(request, obj, form, change)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        instances = formset.save(commit=False)
        for instance in instances:
            if hasattr(instance, "tenant_id") and not instance.tenant_id:
                instance.tenant_id = form.instance.tenant_id
            instance.save()
        for obj in formset.deleted_objects:
            obj.delete()
        formset.save_m2m()


class TenantScopedInline(admin.TabularInline):
    """Inline for tenant-owned children: tenant copied from the parent, FKs limited."""

    extra = 0
    exclude = ["tenant"]

    def get_queryset(self, request: HttpRequest) -> models.QuerySet:
        qs = self.model.all_tenants.all()  # tenant-bypass: the parent admin already scoped
        if request.user.is_superuser:
            return qs
        return qs.filter(tenant_id__in=admin_tenants(request))

    def _allowed(self, request: HttpRequest) -> bool:
        return request.user.is_staff and (request.user.is_superuser or bool(admin_tenants(request)))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request)

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission  # type: ignore[assignment]

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        _limited_foreign_key(db_field, request, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class SecretField(forms.CharField):
    """A write-only form field: blank keeps the stored secret."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.PasswordInput(render_value=False))
        kwargs.setdefault("help_text", "Write-only. Leave blank to keep the stored value.")
        super().__init__(**kwargs)
