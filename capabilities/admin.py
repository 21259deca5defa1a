"""Console for MCP servers: secrets write-only, the tool snapshot, and "Test connection"."""

import json

from django import forms
from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from capabilities.models import McpServer
from capabilities.services import mcp_server_test_connection
from tenants.admin_scoping import TenantScopedModelAdmin
from tenants.crypto import secret_encrypt_json
from tenants.models import Tenant


class _JsonSecretField(forms.CharField):
    def __init__(self, **kwargs):
        super().__init__(
            required=False, widget=forms.Textarea(attrs={"rows": 3}),
            help_text='Write-only JSON object, e.g. {"NAME": "value"}. Blank keeps the stored value; {} clears it.',
            **kwargs,
        )

    def clean(self, value):
        value = super().clean(value)
        if not value.strip():
            return None
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from exc
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise forms.ValidationError("A JSON object of strings.")
        return parsed


class McpServerForm(forms.ModelForm):
    env = _JsonSecretField(label="Environment (stdio)")
    headers = _JsonSecretField(label="Headers (HTTP)")

    class Meta:
        model = McpServer
        fields = "__all__"


def _tools_table(tools: list[dict]) -> str:
    """An HTML table of ``[{name, description}]`` (escaped)."""
    if not tools:
        return format_html("<em>{}</em>", "No tools listed yet.")
    rows = format_html_join(
        "", "<tr><td><code>{}</code></td><td>{}</td></tr>", ((t.get("name", ""), t.get("description", "")) for t in tools)
    )
    return format_html('<table class="mcp-tools"><thead><tr><th>Tool</th><th>Description</th></tr></thead>'
                       "<tbody>{}</tbody></table>", rows)


@admin.register(McpServer)
class McpServerAdmin(TenantScopedModelAdmin):
    """MCP servers of the admin's tenants; the change page shows the last tool snapshot and a
    "Test connection" button (connect with the server's timeouts, list, store the snapshot)."""

    form = McpServerForm
    list_display = ["name", "alias", "transport", "enabled", "tool_count", "tools_snapshot_at", "tenant"]
    readonly_fields = ["tools_snapshot_table", "tools_snapshot_at", "last_error"]
    change_form_template = "admin/capabilities/mcpserver/change_form.html"

    @admin.display(description="Tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools_snapshot or [])

    @admin.display(description="Tools (last snapshot)")
    def tools_snapshot_table(self, obj: McpServer) -> str:
        return _tools_table(obj.tools_snapshot or [])

    def get_urls(self):
        info = self.model._meta.app_label, self.model._meta.model_name
        return [
            path("<path:object_id>/test-connection/", self.admin_site.admin_view(self.test_connection_view),
                 name="%s_%s_test_connection" % info),
        ] + super().get_urls()

    def test_connection_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the stored snapshot and a button; POST: test now and show the tools or the error.

        Another tenant's server is a 404 (the queryset is scoped to the admin's tenants).
        """
        server = self.get_object(request, object_id)
        if server is None or not self.has_change_permission(request, server):
            raise Http404("MCP server not found.")
        result = None
        if request.method == "POST":
            result = mcp_server_test_connection(server=server)
            server.refresh_from_db()
        elif request.method != "GET":
            return redirect(reverse("admin:capabilities_mcpserver_test_connection", args=[server.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": server,
            "title": f"Test connection: {server.name}",
            "result": result,
            "tools_table": _tools_table(
                [{"name": t.name, "description": t.description} for t in result.tools]
                if result is not None and result.ok else server.tools_snapshot or []
            ),
        }
        return TemplateResponse(request, "admin/capabilities/mcpserver/test_connection.html", context)

    def save_model(self, request, obj, form, change):
        if not obj.tenant_id:
            super().save_model(request, obj, form, change)
        tenant = Tenant.objects.get(pk=obj.tenant_id)
        for field in ("env", "headers"):
            value = form.cleaned_data.get(field)
            if value is not None:
                setattr(obj, f"{field}_encrypted", secret_encrypt_json(tenant=tenant, value=value))
        super().save_model(request, obj, form, change)
