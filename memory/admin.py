"""Memories in the console: tenant admins read and delete them, per agent and user.

A memory's text is its user's data: the list shows only memories of tenants the signed-in
user administers, superusers included (a platform superuser without an admin membership in
the tenant sees none). Memories are written by extraction only: no add, no change.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from memory.models import Memory
from sessions.admin import AgentFilter
from tenants.admin_scoping import TenantScopedModelAdmin, admin_tenants


@admin.register(Memory)
class MemoryAdmin(TenantScopedModelAdmin):
    list_display = ["id", "text", "category", "agent", "user", "updated_at", "last_used_at", "tenant"]
    list_filter = [("agent", AgentFilter), "category"]
    search_fields = ["text", "user__username"]
    list_select_related = ["agent", "user", "tenant"]
    exclude = ["embedding"]
    readonly_fields = ["tenant", "user", "agent", "text", "category", "dimensions", "embedding_model",
                       "source_session", "replaced_text", "created_at", "updated_at", "last_used_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Memory]:
        # tenant-bypass: narrowed to the tenants the user administers (superusers too).
        return Memory.all_tenants.filter(tenant_id__in=admin_tenants(request)).defer("embedding")

    def _allowed(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff and bool(admin_tenants(request))

    def _owns(self, request: HttpRequest, obj: Any) -> bool:
        return obj.tenant_id in admin_tenants(request)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
