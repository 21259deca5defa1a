from django.contrib import admin

from browser.models import BrowserDevice, BrowserPairing


@admin.action(description="Revoke the selected devices")
def revoke_devices(modeladmin, request, queryset):
    from browser.services import browser_device_revoke

    for device in queryset.filter(revoked_at__isnull=True):
        browser_device_revoke(device=device)


@admin.register(BrowserDevice)
class BrowserDeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "tenant", "token_prefix", "created_at", "last_seen_at", "revoked_at"]
    search_fields = ["name", "user__username", "token_prefix"]
    list_filter = ["tenant"]
    readonly_fields = ["token_prefix", "token_hash", "created_at", "last_seen_at", "extension_version"]
    actions = [revoke_devices]


@admin.register(BrowserPairing)
class BrowserPairingAdmin(admin.ModelAdmin):
    list_display = ["pk", "name", "user", "tenant", "created_at", "expires_at", "approved_at", "claimed_at"]
    search_fields = ["name", "user__username"]
    readonly_fields = ["code_hash", "poll_secret_hash"]

    def has_add_permission(self, request) -> bool:
        return False



