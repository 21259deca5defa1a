from django import forms
from django.contrib import admin

from llm.models import ModelProvider, ModelRoute, ModelRouteEntry
from tenants.admin_scoping import SecretField, TenantScopedInline, TenantScopedModelAdmin
from tenants.crypto import secret_encrypt
from tenants.models import Tenant


class ProviderForm(forms.ModelForm):
    api_key = SecretField(label="API key")

    class Meta:
        model = ModelProvider
        fields = "__all__"


@admin.register(ModelProvider)
class ModelProviderAdmin(TenantScopedModelAdmin):
    form = ProviderForm
    list_display = ["name", "api", "base_url", "has_api_key", "tenant"]

    def save_model(self, request, obj, form, change):
        if not obj.tenant_id:
            super().save_model(request, obj, form, change)  # assigns the tenant
        api_key = form.cleaned_data.get("api_key")
        if api_key:
            obj.api_key_encrypted = secret_encrypt(tenant=Tenant.objects.get(pk=obj.tenant_id), plaintext=api_key)
        super().save_model(request, obj, form, change)


class RouteEntryInline(TenantScopedInline):
    model = ModelRouteEntry
    fields = ["position", "provider", "model", "max_input_tokens", "max_output_tokens", "tool_calls",
              "supports_tools", "max_retries", "connect_timeout_seconds", "first_token_timeout_seconds",
              "read_timeout_seconds", "stream_timeout_seconds", "input_price_per_mtok", "output_price_per_mtok"]


@admin.register(ModelRoute)
class ModelRouteAdmin(TenantScopedModelAdmin):
    list_display = ["name", "tenant", "created_at"]
    inlines = [RouteEntryInline]
