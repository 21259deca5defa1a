"""Schedules (a cron expression in an IANA time zone, per agent) with one row per slot that
fired, and inbound webhook triggers (per agent, with a Standard Webhooks secret) with one row
per accepted ``webhook-id``. docs/admin-guide.md, "Schedules and webhooks"."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from tenants.scoping import TenantOwnedModel


class ChatMode(models.TextChoices):
    NEW = "new", "A new chat each time"
    FIXED = "fixed", "One fixed chat"


class MissedPolicy(models.TextChoices):
    SKIP = "skip", "Skip slots missed while the platform was down"
    RUN_ONCE = "run_once", "Run once for all slots missed while the platform was down"


class Schedule(TenantOwnedModel):
    """An agent run every time ``cron`` matches the wall clock of ``timezone``.

    ``next_slot_at`` (UTC) is the next slot the scheduler will look at; None while paused.
    """

    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="The user the runs act as (their chats, their rights).",
    )
    name = models.CharField(max_length=200, blank=True)
    cron = models.CharField(max_length=120, help_text="Five fields: minute hour day-of-month month day-of-week.")
    timezone = models.CharField(max_length=64, default="UTC", help_text="An IANA time zone, e.g. Europe/Berlin.")
    message = models.TextField(help_text="The message posted to the agent at each slot.")
    chat_mode = models.CharField(max_length=8, choices=ChatMode.choices, default=ChatMode.NEW)
    chat = models.ForeignKey(
        "agent_sessions.ChatSession",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The chat of chat_mode 'fixed'.",
    )
    missed_policy = models.CharField(max_length=8, choices=MissedPolicy.choices, default=MissedPolicy.SKIP)
    paused = models.BooleanField(default=False)
    next_slot_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name or f"{self.cron} ({self.timezone})"

    def clean(self) -> None:
        """A cron expression cronsim accepts and a known IANA zone (else ValidationError)."""
        from automations.cron import CronInvalid, cron_check, zone_get

        errors = {}
        try:
            self.cron = cron_check(self.cron)
        except CronInvalid as exc:
            errors["cron"] = str(exc)
        try:
            zone_get(self.timezone)
        except CronInvalid as exc:
            errors["timezone"] = str(exc)
        if errors:
            raise ValidationError(errors)


class SlotStatus(models.TextChoices):
    STARTED = "started", "Run started"
    FAILED = "failed", "Start failed"


class ScheduleSlot(TenantOwnedModel):
    """One slot of a schedule that fired: the unique (schedule, slot_time) pair is what makes
    a slot start at most one run however many schedulers look at it."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="slots")
    slot_time = models.DateTimeField(help_text="The slot's instant (UTC).")
    catch_up = models.BooleanField(default=False, help_text="Fired late for missed slots (policy run_once).")
    status = models.CharField(max_length=8, choices=SlotStatus.choices, default=SlotStatus.STARTED)
    run = models.ForeignKey("agent_sessions.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-slot_time"]
        constraints = [models.UniqueConstraint(fields=["schedule", "slot_time"], name="schedule_slot_unique")]


class WebhookTrigger(TenantOwnedModel):
    """An agent started by a signed HTTP request to ``/hooks/<id>/`` (Standard Webhooks)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", help_text="The user the runs act as."
    )
    name = models.CharField(max_length=200, blank=True)
    template = models.TextField(
        default="Webhook received:\n{{ payload }}",
        help_text="The message: {{ field.sub }} is the payload's field, {{ payload }} all of it.",
    )
    secret_encrypted = models.TextField(editable=False, help_text="The whsec_ secret, encrypted with the tenant's key.")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.name or str(self.id)


class InboundWebhook(TenantOwnedModel):
    """One accepted request of a trigger, by its ``webhook-id``: a replay of the id starts no
    second run (the unique pair)."""

    trigger = models.ForeignKey(WebhookTrigger, on_delete=models.CASCADE, related_name="received")
    webhook_id = models.CharField(max_length=255)
    run = models.ForeignKey("agent_sessions.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    chat = models.ForeignKey(
        "agent_sessions.ChatSession", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]
        constraints = [models.UniqueConstraint(fields=["trigger", "webhook_id"], name="inbound_webhook_unique_id")]


class EventType(models.TextChoices):
    """The events an outbound subscription may receive (names are API)."""

    RUN_COMPLETED = "run.completed", "A run completed"
    RUN_FAILED = "run.failed", "A run failed"
    APPROVAL_REQUESTED = "approval.requested", "A run waits for approvals"
    APPROVAL_DECIDED = "approval.decided", "An approval was decided (by a person or its timeout)"
    SCHEDULE_FAILED = "schedule.failed", "A schedule's slot could not start its run"


A2A_PUSH_EVENT = "a2a.task"
"""The ``event_type`` of an A2A push notification's delivery (not a subscription's event)."""


class WebhookSubscription(TenantOwnedModel):
    """An endpoint of another system that receives the tenant's events, signed per Standard
    Webhooks with ``secret_encrypted`` (shown once, stored encrypted)."""

    url = models.URLField(max_length=2000)
    event_types = models.JSONField(default=list, help_text='Event names, e.g. ["run.completed"].')
    description = models.CharField(max_length=200, blank=True)
    secret_encrypted = models.TextField(editable=False)
    is_active = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Waiting for its next attempt"
    DELIVERED = "delivered", "Delivered (2xx)"
    FAILED = "failed", "Given up (24 hours of retries, or the endpoint answered 410)"


class WebhookDelivery(TenantOwnedModel):
    """One event for one subscription, or one A2A push notification for one task's
    push-notification config (``push_config``; none of either once that config was deleted):
    its ``message_id`` is the ``webhook-id`` every attempt sends (the receiver's idempotency key)."""

    subscription = models.ForeignKey(
        WebhookSubscription, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    push_config = models.ForeignKey(
        "agent_sessions.TaskPushConfig", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="An A2A push notification: the task's config it is sent to (sessions.api.a2a.push).",
    )
    event_type = models.CharField(max_length=40)
    message_id = models.CharField(max_length=64, unique=True)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    retry_until = models.DateTimeField(help_text="Failed attempts are retried until then (24 hours).")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class DeliveryAttempt(TenantOwnedModel):
    """One HTTP attempt of a delivery: the status code, or the error (refused address,
    timeout, connection failure)."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    attempted_at = models.DateTimeField(auto_now_add=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-attempted_at", "-id"]
