"""Guardrails in the console (Agents → Guardrails): the tenant's, searchable by name, agent and
message, filtered by point, kind and action; each save records a new version of its agent."""

from django.contrib import admin

from guardrails.models import Guardrail
from tenants.admin_scoping import TenantScopedModelAdmin


@admin.register(Guardrail)
class GuardrailAdmin(TenantScopedModelAdmin):
    list_display = ["name", "agent", "point", "kind", "action", "on_error", "position", "enabled", "tenant"]
    list_filter = ["point", "kind", "action", "enabled"]
    search_fields = ["name", "agent__name", "message"]
    ordering = ["agent__name", "point", "position", "id"]
    fields = ["tenant", "agent", "name", "point", "kind", "position", "action", "on_error", "config", "route",
              "message", "enabled"]
