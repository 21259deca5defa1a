from django import forms
from django.contrib import admin, messages
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.urls import path
from django.utils.html import format_html_join
from django.views.decorators.http import require_POST

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
    search_fields = ["name", "base_url"]
    list_filter = ["api"]
    ordering = ["-created_at", "-id"]

    def get_urls(self):
        """``<id>/test/`` (POST: reach the provider, list its models) and ``<id>/models/``
        (GET, JSON: the model ids for the route form; console/providers.py)."""
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/test/", wrap(require_POST(self.test_view)), name="llm_modelprovider_test"),
            path("<path:object_id>/models/", wrap(self.models_view), name="llm_modelprovider_models"),
        ] + super().get_urls()

    def _provider(self, request, object_id):
        try:
            obj = self.get_queryset(request).filter(pk=int(object_id)).first()
        except ValueError:
            obj = None
        if obj is None or not self.has_view_permission(request, obj):
            raise Http404("Not found.")
        return obj

    def test_view(self, request, object_id):
        from console.providers import provider_models

        provider = self._provider(request, object_id)
        result = provider_models(provider=provider, use_cache=False)
        if result["ok"]:
            shown = ", ".join(result["models"][:20]) + (" …" if len(result["models"]) > 20 else "")
            self.message_user(request, f"{provider.name} answered in {result['latency_ms']} ms with "
                              f"{len(result['models'])} model(s): {shown or 'none listed'}.", messages.SUCCESS)
        else:
            self.message_user(request, f"{provider.name} could not be reached or refused: {result['error_class']}: "
                              f"{result['error']}", messages.ERROR)
        return redirect("admin:llm_modelprovider_change", provider.pk)

    def models_view(self, request, object_id):
        from console.providers import provider_models

        result = provider_models(provider=self._provider(request, object_id))
        return JsonResponse({k: result.get(k) for k in ("ok", "models", "error_class", "error", "cached")})

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
        (None, {"fields": [("position", "provider", "model"),
                           ("tool_calls", "supports_tools", "supports_images", "json_schema_mode", "temperature")]}),
        ("Limits and retries", {"fields": [("max_input_tokens", "max_output_tokens", "max_retries")]}),
        ("Timeouts (seconds)", {"fields": [("connect_timeout_seconds", "first_token_timeout_seconds"),
                                           ("read_timeout_seconds", "stream_timeout_seconds")]}),
        ("Prices (USD per million tokens)", {"fields": [("input_price_per_mtok", "output_price_per_mtok")]}),
    ]


@admin.register(ModelRoute)
class ModelRouteAdmin(TenantScopedModelAdmin):
    list_display = ["name", "tenant", "created_at"]
    search_fields = ["name", "description", "entries__model", "entries__provider__name"]
    ordering = ["-created_at", "-id"]
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

    def get_urls(self):
        """``<id>/test/`` (POST): the "Test this route" button of the change page."""
        return [path("<path:object_id>/test/", self.admin_site.admin_view(require_POST(self.test_view)),
                     name="llm_modelroute_test")] + super().get_urls()

    def test_view(self, request, object_id):
        try:
            route = self.get_queryset(request).filter(pk=int(object_id)).first()
        except ValueError:
            route = None
        if route is None or not self.has_view_permission(request, route):
            raise Http404("Not found.")
        self.test_routes(request, [route])
        return redirect("admin:llm_modelroute_change", route.pk)

    @admin.display(description="Entry health (shared by all workers)")
    def entry_health(self, obj):
        from console.dashboard import plain_breaker_state
        from console.templatetags.console import when

        if obj.pk is None:
            return "-"
        with tenant_scope(obj.tenant_id):
            rows = route_health(route=obj)
        return format_html_join(
            "\n", "<div>#{} {}:{}: <b>{}</b>{} · last minute: {} calls, {} failed{}</div>",
            ((r["position"], r["provider"], r["model"], plain_breaker_state(r["state"]),
              f" (until {when(r['cooldown_until'])})" if r["cooldown_until"] and r["state"] != "closed" else "",
              r["calls_last_minute"], r["failures_last_minute"],
              f" · last error: {r['last_error_class']}" if r["last_error_class"] else "") for r in rows),
        ) or "no entries"
