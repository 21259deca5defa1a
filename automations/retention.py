"""How long webhook rows are kept: ``WEBHOOK_LOG_RETENTION_DAYS`` (default 30; 0 keeps them).

- Outbound deliveries that ended (``delivered`` or ``failed``) and were created before the
  cutoff go, with their attempt log (cascade). Pending deliveries stay whatever their age (they
  end within ``retry_until``, 24 hours).
- Inbound requests (:class:`automations.models.InboundWebhook`, one per accepted ``webhook-id``)
  received before the cutoff go. Their only job after the run started is to refuse a replay of
  the same id, and Standard Webhooks receivers refuse any request whose ``webhook-timestamp``
  is more than 5 minutes old (:mod:`automations.hooks`), so a row older than a day guards
  nothing the signature check does not.

Runs and chats the rows point at are not touched (chats have their own purge,
``CHAT_PURGE_AFTER_DAYS``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from automations.models import DeliveryStatus, InboundWebhook, WebhookDelivery
from tenants.scoping import system_scope, tenant_scope

PURGE_BATCH = 5000
"""Rows of each kind deleted per tenant and call, at most (the hourly beat catches up)."""


def retention_days() -> int:
    """``WEBHOOK_LOG_RETENTION_DAYS``: days a webhook row is kept; 0 or less keeps them forever."""
    return int(getattr(settings, "WEBHOOK_LOG_RETENTION_DAYS", 30))


def webhook_rows_purge(*, now: datetime | None = None) -> dict[str, int]:
    """Delete every tenant's webhook rows older than :func:`retention_days` (the beat task
    ``automations.webhook_rows_purge``, hourly), each tenant's in its own scope.

    Returns:
        ``{"deliveries": n, "inbound": m}``: the rows deleted (attempts go with their delivery
        and are not counted). Both 0 when retention is off.
    """
    days = retention_days()
    if days <= 0:
        return {"deliveries": 0, "inbound": 0}
    cutoff = (now or timezone.now()) - timedelta(days=days)
    ended = [DeliveryStatus.DELIVERED, DeliveryStatus.FAILED]
    # tenant-bypass: the purge finds which tenants have old rows, then deletes each tenant's in its scope.
    with system_scope():
        deliveries = WebhookDelivery.objects.unscoped().filter(created_at__lt=cutoff, status__in=ended)
        inbound = InboundWebhook.objects.unscoped().filter(received_at__lt=cutoff)
        tenants = set(deliveries.values_list("tenant_id", flat=True).distinct())
        tenants |= set(inbound.values_list("tenant_id", flat=True).distinct())
    deleted = {"deliveries": 0, "inbound": 0}
    for tenant_id in sorted(tenants):
        with tenant_scope(tenant_id):
            old = WebhookDelivery.objects.filter(created_at__lt=cutoff, status__in=ended)
            ids = list(old.order_by("created_at").values_list("pk", flat=True)[:PURGE_BATCH])
            counts = WebhookDelivery.objects.filter(pk__in=ids).delete()[1]
            deleted["deliveries"] += counts.get(WebhookDelivery._meta.label, 0)
            ids = list(
                InboundWebhook.objects.filter(received_at__lt=cutoff)
                .order_by("received_at")
                .values_list("pk", flat=True)[:PURGE_BATCH]
            )
            deleted["inbound"] += InboundWebhook.objects.filter(pk__in=ids).delete()[0]
    return deleted
