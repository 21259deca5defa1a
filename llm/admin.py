from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html_join

from llm.models import ModelProvider, ModelRoute, ModelRouteEntry
from llm.services import route_health, route_test
from tenants.admin_scoping import SecretField, TenantScopedInline, TenantScopedModelAdmin
from tenants.crypto import secret_encrypt
from tenants.models import Tenant
from tenants.scoping import tenant_scope


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
    template = "admin/edit_inline/stacked.html"  # too many fields for a table row
    fieldsets = [
        (None, {"fields": [("position", "provider", "model"), ("tool_calls", "supports_tools", "temperature")]}),
        ("Limits and retries", {"fields": [("max_input_tokens", "max_output_tokens", "max_retries")]}),
        ("Timeouts (seconds)", {"fields": [("connect_timeout_seconds", "first_token_timeout_seconds"),
                                           ("read_timeout_seconds", "stream_timeout_seconds")]}),
        ("Prices (USD per million tokens)", {"fields": [("input_price_per_mtok", "output_price_per_mtok")]}),
    ]


@admin.register(ModelRoute)
class ModelRouteAdmin(TenantScopedModelAdmin):
    list_display = ["name", "tenant", "created_at"]
    inlines = [RouteEntryInline]
    readonly_fields = ["entry_health"]
    actions = ["test_routes"]

    @admin.action(description="Test the selected routes (a tiny request through each entry)")
    def test_routes(self, request, queryset):
        for route in queryset:
            with tenant_scope(route.tenant_id):
                results = route_test(route=route)
            for r in results:
                if r["ok"]:
                    self.message_user(request, f"{route.name} #{r['position']} {r['provider']}:{r['model']}: "
                                      f"OK in {r['latency_ms']} ms", messages.SUCCESS)
                else:
                    self.message_user(request, f"{route.name} #{r['position']} {r['provider']}:{r['model']}: "
                                      f"{r['error_class']}: {r['error']}", messages.ERROR)

    @admin.display(description="Entry health (shared by all workers)")
    def entry_health(self, obj):
        if obj.pk is None:
            return "-"
        with tenant_scope(obj.tenant_id):
            rows = route_health(route=obj)
        return format_html_join(
            "\n", "<div>#{} {}:{}: <b>{}</b>{} · last minute: {} calls, {} failed{}</div>",
            ((r["position"], r["provider"], r["model"], r["state"],
              f" until {r['cooldown_until']}" if r["cooldown_until"] else "",
              r["calls_last_minute"], r["failures_last_minute"],
              f" · last error: {r['last_error_class']}" if r["last_error_class"] else "") for r in rows),
        ) or "no entries"
