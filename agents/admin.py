"""Agents and their capability bindings in the console.

The agent page has "Try this agent" (the playground: ``console/views.py``) and "Versions"
(list, diff, publish, roll back: ``console.views.agent_versions_view``); bindings use
:class:`console.forms.BindingForm` (built-in tools from a list, allowed tools from the MCP
server's tool list, the approval policy as rows, only the fields of the chosen kind).
"""

from django import forms
from django.contrib import admin
from django.urls import path

from agents.models import AgentInstance, CapabilityBinding
from agents.versions import versions_batch
from capabilities.registry import BINDING_FIELDS
from console.forms import BindingForm
from tenants.admin_scoping import TenantScopedInline, TenantScopedModelAdmin


class BindingInline(TenantScopedInline):
    model = CapabilityBinding
    form = BindingForm
    template = "admin/edit_inline/stacked.html"  # each binding shows only its kind's fields
    fields = ["kind", *BINDING_FIELDS, "enabled"]  # the form shows the chosen kind's (CapabilityKind.fields)


class AgentForm(forms.ModelForm):
    """The agent form: structured output and routing rules as JSON (checked by the model's
    ``clean``: a valid JSON Schema; rules naming this tenant's routes); left out or blank, they
    take their defaults (2 repairs, no rules) rather than an error."""

    class Meta:
        model = AgentInstance
        fields = "__all__"
        widgets = {"output_schema": forms.Textarea(attrs={"rows": 6, "class": "vLargeTextField"}),
                   "routing_rules": forms.Textarea(attrs={"rows": 6, "class": "vLargeTextField"})}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "output_repairs" in self.fields:
            self.fields["output_repairs"].required = False

    def clean_output_repairs(self):
        value = self.cleaned_data.get("output_repairs")
        return AgentInstance._meta.get_field("output_repairs").default if value is None else value

    def clean_routing_rules(self):
        value = self.cleaned_data.get("routing_rules")
        return [] if value is None else value


@admin.register(AgentInstance)
class AgentInstanceAdmin(TenantScopedModelAdmin):
    form = AgentForm
    list_display = ["name", "slug", "route", "max_loop_count", "is_active", "updated_at", "tenant"]
    list_filter = ["is_active", "message_mode"]
    search_fields = ["name", "slug", "description", "system_prompt"]
    ordering = ["-updated_at", "-id"]
    inlines = [BindingInline]

    def get_urls(self):
        from console.views import agent_playground_view, agent_versions_view, agents_export_view, agents_import_view

        urls = [path("export/", self.admin_site.admin_view(lambda request: agents_export_view(self, request)),
                     name="agents_agentinstance_export"),
                path("import/", self.admin_site.admin_view(lambda request: agents_import_view(self, request)),
                     name="agents_agentinstance_import"),
                path("<path:object_id>/playground/",
                     self.admin_site.admin_view(lambda request, object_id: agent_playground_view(self, request, object_id)),
                     name="agents_agentinstance_playground"),
                path("<path:object_id>/versions/",
                     self.admin_site.admin_view(lambda request, object_id: agent_versions_view(self, request, object_id)),
                     name="agents_agentinstance_versions")]
        return urls + super().get_urls()

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """The agent form with its binding rows: one version for the whole save, by the admin user."""
        with versions_batch(user=request.user):
            return super().changeform_view(request, object_id, form_url, extra_context)


@admin.register(CapabilityBinding)
class CapabilityBindingAdmin(TenantScopedModelAdmin):
    form = BindingForm
    list_display = ["agent", "kind", "mcp_server", "builtin_name", "cli_command", "enabled", "tenant"]
    list_filter = ["kind", "enabled"]
    search_fields = ["agent__name", "builtin_name", "mcp_server__name", "cli_command__name", "skill__name"]
    ordering = ["-created_at", "-id"]
