"""Webhook rows past WEBHOOK_LOG_RETENTION_DAYS go (automations/retention.py): ended deliveries
with their attempts and old inbound requests, every tenant's; pending deliveries and recent
rows stay; 0 keeps everything."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.tests.factories import AgentFactory
from automations.models import DeliveryAttempt, InboundWebhook, WebhookDelivery, WebhookTrigger
from automations.retention import webhook_rows_purge
from automations.tasks import webhook_rows_purge as purge_task
from tenants.scoping import system_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _delivery(world, status, age_days):
    now = timezone.now()
    delivery = WebhookDelivery.all_tenants.create(
        tenant=world.tenant, event_type="run.completed", message_id=f"msg_{status}_{age_days}_{world.tenant.pk}",
        payload={}, status=status, retry_until=now + timedelta(days=1),
    )
    DeliveryAttempt.all_tenants.create(tenant=world.tenant, delivery=delivery, status_code=200)
    WebhookDelivery.all_tenants.filter(pk=delivery.pk).update(created_at=now - timedelta(days=age_days))
    return delivery


def _inbound(world, webhook_id, age_days):
    trigger = WebhookTrigger.all_tenants.filter(tenant=world.tenant).first() or WebhookTrigger.all_tenants.create(
        tenant=world.tenant, agent=AgentFactory(tenant=world.tenant), owner=world.admin, secret_encrypted="x"
    )
    row = InboundWebhook.all_tenants.create(tenant=world.tenant, trigger=trigger, webhook_id=webhook_id)
    InboundWebhook.all_tenants.filter(pk=row.pk).update(received_at=timezone.now() - timedelta(days=age_days))
    return row


def test_old_rows_of_every_tenant_go_and_the_rest_stays(world, other_world, settings):
    settings.WEBHOOK_LOG_RETENTION_DAYS = 30
    old = [_delivery(w, status, 31) for w in (world, other_world) for status in ("delivered", "failed")]
    kept = [_delivery(world, "pending", 40), _delivery(world, "delivered", 29)]
    old_in = [_inbound(world, "old", 31), _inbound(other_world, "old", 45)]
    kept_in = _inbound(world, "recent", 1)

    assert purge_task() == {"deliveries": 4, "inbound": 2}
    with system_scope():
        assert set(WebhookDelivery.all_tenants.values_list("pk", flat=True)) == {d.pk for d in kept}
        assert not DeliveryAttempt.all_tenants.filter(delivery_id__in=[d.pk for d in old]).exists()
        assert DeliveryAttempt.all_tenants.filter(delivery_id__in=[d.pk for d in kept]).count() == 2
        assert list(InboundWebhook.all_tenants.values_list("pk", flat=True)) == [kept_in.pk]
    assert all(not InboundWebhook.all_tenants.filter(pk=r.pk).exists() for r in old_in)
    assert webhook_rows_purge() == {"deliveries": 0, "inbound": 0}


def test_zero_keeps_everything(world, settings):
    settings.WEBHOOK_LOG_RETENTION_DAYS = 0
    _delivery(world, "delivered", 400)
    _inbound(world, "ancient", 400)
    assert webhook_rows_purge() == {"deliveries": 0, "inbound": 0}
    assert WebhookDelivery.all_tenants.count() == 1 and InboundWebhook.all_tenants.count() == 1
