from django.contrib import admin

from tenants.admin_scoping import TenantScopedModelAdmin
from tenants.models import ApiToken, Membership, Tenant
from tenants.services import tenant_create


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    prepopulated_fields = {"slug": ["name"]}

    def has_module_permission(self, request):
        return request.user.is_superuser

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
        else:
            created = tenant_create(name=obj.name, slug=obj.slug)
            obj.pk, obj.wrapped_data_key = created.pk, created.wrapped_data_key


@admin.register(Membership)
class MembershipAdmin(TenantScopedModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]


@admin.register(ApiToken)
class ApiTokenAdmin(TenantScopedModelAdmin):
    list_display = ["prefix", "name", "membership", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]

    def has_add_permission(self, request, *args):
        return False  # issued through the API or seed_demo --print-token: the raw token is shown once
