from django.contrib import admin

from agents.models import AgentInstance, CapabilityBinding
from tenants.admin_scoping import TenantScopedInline, TenantScopedModelAdmin


class BindingInline(TenantScopedInline):
    model = CapabilityBinding
    fields = ["kind", "mcp_server", "builtin_name", "cli_command", "allowed_tools", "enabled"]


@admin.register(AgentInstance)
class AgentInstanceAdmin(TenantScopedModelAdmin):
    list_display = ["name", "route", "max_loop_count", "is_active", "tenant"]
    inlines = [BindingInline]


@admin.register(CapabilityBinding)
class CapabilityBindingAdmin(TenantScopedModelAdmin):
    list_display = ["agent", "kind", "mcp_server", "builtin_name", "cli_command", "enabled", "tenant"]
