import json
import re

from django import forms
from django.contrib import admin

from capabilities.models import CliCommand, McpServer
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


@admin.register(McpServer)
class McpServerAdmin(TenantScopedModelAdmin):
    form = McpServerForm
    list_display = ["name", "alias", "transport", "enabled", "tenant"]

    def save_model(self, request, obj, form, change):
        if not obj.tenant_id:
            super().save_model(request, obj, form, change)
        tenant = Tenant.objects.get(pk=obj.tenant_id)
        for field in ("env", "headers"):
            value = form.cleaned_data.get(field)
            if value is not None:
                setattr(obj, f"{field}_encrypted", secret_encrypt_json(tenant=tenant, value=value))
        super().save_model(request, obj, form, change)


class CliCommandForm(forms.ModelForm):
    env = _JsonSecretField(label="Environment variables")

    def clean_env(self):
        value = self.cleaned_data.get("env")
        bad = [k for k in (value or {}) if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise forms.ValidationError(f"Not valid variable names: {', '.join(sorted(bad))}.")
        if any("\0" in v for v in (value or {}).values()):
            raise forms.ValidationError("Values may not contain NUL characters.")
        return value

    class Meta:
        model = CliCommand
        fields = "__all__"


@admin.register(CliCommand)
class CliCommandAdmin(TenantScopedModelAdmin):
    """CLI commands; the env is write-only and stored encrypted (like an MCP server's)."""

    form = CliCommandForm
    list_display = ["name", "program", "allow_network", "unsandboxed", "enabled", "tenant"]
    list_filter = ["enabled", "allow_network", "unsandboxed"]
    readonly_fields = ["env_is_set"]

    @admin.display(description="Program")
    def program(self, obj: CliCommand) -> str:
        return obj.argv_template[0] if obj.argv_template else ""

    @admin.display(description="Environment stored", boolean=True)
    def env_is_set(self, obj: CliCommand) -> bool:
        return bool(obj.env_encrypted)

    def save_model(self, request, obj, form, change):
        value = form.cleaned_data.get("env")
        if value is not None:
            if not obj.tenant_id:
                super().save_model(request, obj, form, change)  # assigns the tenant
            obj.env_encrypted = secret_encrypt_json(tenant=Tenant.objects.get(pk=obj.tenant_id), value=value)
        super().save_model(request, obj, form, change)
