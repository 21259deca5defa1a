"""Console page of single sign-on's identity links (superusers only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenants.audit import AuditedModelAdminMixin
from tenants.oidc.models import OidcIdentity, OidcSession


class OidcSessionInline(admin.TabularInline):
    """The identity's login sessions that the provider's back-channel logout can end (read-only)."""

    model = OidcSession
    fields = ["sid", "created_at"]
    readonly_fields = ["sid", "created_at"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(OidcIdentity)
class OidcIdentityAdmin(AuditedModelAdminMixin, admin.ModelAdmin):
    """Single sign-on's links of users to the provider's accounts (superusers only). Read-only:
    the first login through the provider makes them; deleting one unlinks the user (their next
    login through the provider makes a new account)."""

    list_display = ["user", "subject", "issuer", "created_at", "last_login_at"]
    search_fields = ["user__username", "subject", "issuer"]
    readonly_fields = ["user", "issuer", "subject", "created_at", "last_login_at"]
    inlines = [OidcSessionInline]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser
