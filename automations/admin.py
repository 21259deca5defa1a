"""The console's pages for schedules (with the slots they fired) and webhook triggers (with the
requests they accepted); the trigger's secret is never shown here (the API shows it once)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from automations.models import (
    DeliveryAttempt,
    InboundWebhook,
    Schedule,
    ScheduleSlot,
    WebhookDelivery,
    WebhookSubscription,
    WebhookTrigger,
)
from automations.outbound import delivery_redeliver
from automations.services import schedule_next_slot
from tenants.admin_scoping import TenantScopedInline, TenantScopedModelAdmin
from tenants.scoping import tenant_scope


class ScheduleSlotInline(TenantScopedInline):
    model = ScheduleSlot
    extra = 0
    can_delete = False
    fields = ("slot_time", "catch_up", "status", "run", "error")
    readonly_fields = fields


@admin.register(Schedule)
class ScheduleAdmin(TenantScopedModelAdmin):
    search_fields = ("name", "cron", "message", "agent__name")
    list_display = ("__str__", "tenant", "agent", "owner", "cron", "timezone", "paused", "next_slot_at")
    list_filter = ("paused", "missed_policy", "chat_mode")
    readonly_fields = ("next_slot_at", "created_at", "updated_at")
    inlines = [ScheduleSlotInline]

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        """Save, with the next slot computed from now (as the API's save does)."""
        obj.next_slot_at = schedule_next_slot(obj, after=timezone.now())
        super().save_model(request, obj, form, change)


class InboundWebhookInline(TenantScopedInline):
    model = InboundWebhook
    extra = 0
    can_delete = False
    fields = ("webhook_id", "received_at", "run", "chat")
    readonly_fields = fields


@admin.register(WebhookTrigger)
class WebhookTriggerAdmin(TenantScopedModelAdmin):
    search_fields = ("name", "agent__name")
    list_display = ("__str__", "tenant", "agent", "owner", "is_active", "created_at")
    list_filter = ("is_active",)
    exclude = ("secret_encrypted",)
    readonly_fields = ("id", "created_at")
    inlines = [InboundWebhookInline]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # made through the API, which shows the new secret once


class DeliveryAttemptInline(TenantScopedInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("attempted_at", "status_code", "error", "duration_ms")
    readonly_fields = fields


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(TenantScopedModelAdmin):
    search_fields = ("url", "description")
    list_display = ("url", "tenant", "event_types", "is_active", "disabled_reason", "created_at")
    list_filter = ("is_active",)
    exclude = ("secret_encrypted",)
    readonly_fields = ("disabled_reason", "created_at")

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # made through the admin API, which checks the URL and shows the secret once


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(TenantScopedModelAdmin):
    search_fields = ("event_type", "message_id", "subscription__url")
    """The delivery log; the action "Redeliver" queues one more attempt of each selected one."""

    list_display = (
        "message_id",
        "tenant",
        "subscription",
        "event_type",
        "status",
        "attempts",
        "next_attempt_at",
        "created_at",
    )
    list_filter = ("status", "event_type")
    readonly_fields = (
        "subscription",
        "push_config",
        "event_type",
        "message_id",
        "payload",
        "status",
        "attempts",
        "next_attempt_at",
        "retry_until",
        "created_at",
        "delivered_at",
    )
    inlines = [DeliveryAttemptInline]
    actions = ["redeliver"]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    @admin.action(description="Redeliver")
    def redeliver(self, request: HttpRequest, queryset: Any) -> None:
        done = 0
        for delivery in queryset.select_related("subscription"):
            try:
                with tenant_scope(delivery.tenant_id):  # the console sets the database's scope, not the ORM's
                    delivery_redeliver(delivery=delivery)
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"{delivery.message_id}: {exc.message}", level="error")
        self.message_user(request, f"{done} queued for delivery.")
