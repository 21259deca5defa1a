"""Serializers of the schedules and webhook-trigger API."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.models import AgentInstance
from automations.cron import zone_get
from automations.models import (
    DeliveryAttempt,
    Schedule,
    ScheduleSlot,
    WebhookDelivery,
    WebhookSubscription,
    WebhookTrigger,
)
from automations.services import schedule_upcoming
from sessions.models import ChatSession
from tenants.api.mixins import TenantPrimaryKeyRelatedField


class ScheduleSerializer(serializers.ModelSerializer):
    """A schedule; ``next_runs``: its next 5 slots (ISO 8601 in the schedule's time zone;
    [] while paused)."""

    agent = TenantPrimaryKeyRelatedField(AgentInstance)
    chat = TenantPrimaryKeyRelatedField(ChatSession, required=False, allow_null=True)
    owner = serializers.IntegerField(source="owner_id", read_only=True)
    next_runs = serializers.SerializerMethodField()

    class Meta:
        model = Schedule
        fields = [
            "id",
            "name",
            "agent",
            "owner",
            "cron",
            "timezone",
            "message",
            "chat_mode",
            "chat",
            "missed_policy",
            "paused",
            "next_runs",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "owner", "next_runs", "created_at", "updated_at"]

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_runs(self, obj: Schedule) -> list[str]:
        zone = zone_get(obj.timezone)
        return [slot.astimezone(zone).isoformat() for slot in schedule_upcoming(obj)]


class ScheduleSlotSerializer(serializers.ModelSerializer):
    """A slot that fired: ``status`` started (``run``) or failed (``error``: why)."""

    class Meta:
        model = ScheduleSlot
        fields = ["id", "slot_time", "catch_up", "status", "run", "error", "created_at"]


class WebhookTriggerSerializer(serializers.ModelSerializer):
    """A trigger; ``url``: where to POST (path on this host); ``secret`` appears in the answer
    that creates the trigger or rotates its secret only."""

    agent = TenantPrimaryKeyRelatedField(AgentInstance)
    owner = serializers.IntegerField(source="owner_id", read_only=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = WebhookTrigger
        fields = ["id", "name", "agent", "owner", "template", "is_active", "url", "created_at"]
        read_only_fields = ["id", "owner", "url", "created_at"]

    def get_url(self, obj: WebhookTrigger) -> str:
        return f"/hooks/{obj.id}/"


class TriggerSecretSerializer(WebhookTriggerSerializer):
    secret = serializers.CharField(read_only=True, help_text="whsec_…: shown once; store it now.")

    class Meta(WebhookTriggerSerializer.Meta):
        fields = [*WebhookTriggerSerializer.Meta.fields, "secret"]


class WebhookSubscriptionSerializer(serializers.ModelSerializer):
    """An outbound subscription; ``secret`` only in the create answer."""

    event_types = serializers.ListField(child=serializers.CharField(max_length=40), allow_empty=False)

    class Meta:
        model = WebhookSubscription
        fields = ["id", "url", "event_types", "description", "is_active", "disabled_reason", "created_at"]
        read_only_fields = ["id", "disabled_reason", "created_at"]


class SubscriptionSecretSerializer(WebhookSubscriptionSerializer):
    secret = serializers.CharField(read_only=True, help_text="whsec_…: shown once; store it now.")

    class Meta(WebhookSubscriptionSerializer.Meta):
        fields = [*WebhookSubscriptionSerializer.Meta.fields, "secret"]


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["attempted_at", "status_code", "error", "duration_ms"]


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """A delivery with its attempts (newest first)."""

    attempt_log = DeliveryAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "subscription",
            "event_type",
            "message_id",
            "payload",
            "status",
            "attempts",
            "next_attempt_at",
            "retry_until",
            "created_at",
            "delivered_at",
            "attempt_log",
        ]
