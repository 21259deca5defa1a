"""The console's schedule and trigger pages: a tenant admin sees their tenant's rows (the slots
and requests inline, never the trigger's secret), another tenant's admin gets 404; saving a
schedule in the console computes its next slot."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.tests.factories import AgentFactory
from automations.models import InboundWebhook, Schedule, ScheduleSlot
from automations.services import trigger_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_schedule_and_trigger_pages(world, other_world):
    agent = AgentFactory(tenant=world.tenant)
    schedule = Schedule.all_tenants.create(
        tenant=world.tenant,
        agent=agent,
        owner=world.member,
        cron="0 8 * * *",
        timezone="Europe/Berlin",
        message="report",
        name="Morning report",
    )
    ScheduleSlot.all_tenants.create(
        tenant=world.tenant,
        schedule=schedule,
        slot_time="2026-12-07T07:00:00Z",
        status="failed",
        error="The schedule's agent is not active.",
    )
    trigger, secret = trigger_create(tenant=world.tenant, owner=world.member, agent=agent, name="issues")
    InboundWebhook.all_tenants.create(tenant=world.tenant, trigger=trigger, webhook_id="msg_console_1")
    mine = _console(world.admin)
    assert "Morning report" in mine.get("/admin/automations/schedule/").content.decode()
    page = mine.get(f"/admin/automations/schedule/{schedule.pk}/change/").content.decode()
    assert "agent is not active" in page
    page = mine.get(f"/admin/automations/webhooktrigger/{trigger.pk}/change/").content.decode()
    assert "msg_console_1" in page and secret not in page and trigger.secret_encrypted not in page
    assert mine.get("/admin/automations/webhooktrigger/add/").status_code == 403
    theirs = _console(other_world.admin)
    assert theirs.get(f"/admin/automations/schedule/{schedule.pk}/change/").status_code in {302, 404}
    assert "Morning report" not in theirs.get("/admin/automations/schedule/").content.decode()
    assert theirs.get(f"/admin/automations/webhooktrigger/{trigger.pk}/change/").status_code in {302, 404}


def test_saving_in_the_console_sets_the_next_slot(world):
    agent = AgentFactory(tenant=world.tenant)
    client = _console(world.admin)
    resp = client.post(
        "/admin/automations/schedule/add/",
        {
            "agent": agent.pk,
            "owner": world.member.pk,
            "name": "nightly",
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "message": "nightly digest",
            "chat_mode": "new",
            "missed_policy": "skip",
            "slots-TOTAL_FORMS": "0",
            "slots-INITIAL_FORMS": "0",
            "slots-MIN_NUM_FORMS": "0",
            "slots-MAX_NUM_FORMS": "0",
        },
    )
    assert resp.status_code == 302, resp.content.decode()[:3000]
    schedule = Schedule.all_tenants.get(name="nightly")
    assert schedule.next_slot_at is not None and schedule.next_slot_at.minute == 30
    bad = client.post(
        "/admin/automations/schedule/add/",
        {
            "agent": agent.pk,
            "owner": world.member.pk,
            "cron": "99 2 * * *",
            "timezone": "Nowhere/Land",
            "message": "x",
            "chat_mode": "new",
            "missed_policy": "skip",
            "slots-TOTAL_FORMS": "0",
            "slots-INITIAL_FORMS": "0",
            "slots-MIN_NUM_FORMS": "0",
            "slots-MAX_NUM_FORMS": "0",
        },
    )
    assert bad.status_code == 200 and "Invalid cron expression" in bad.content.decode()
    assert "Unknown time zone" in bad.content.decode()


def test_delivery_log_pages_and_redeliver_action(world, other_world):
    from automations.models import DeliveryAttempt, WebhookDelivery, WebhookSubscription

    subscription = WebhookSubscription.all_tenants.create(tenant=world.tenant, url="https://hooks.example.com/x",
                                                          event_types=["run.failed"], secret_encrypted="cipher-xyz")
    delivery = WebhookDelivery.all_tenants.create(tenant=world.tenant, subscription=subscription,
                                                  event_type="run.failed", message_id="msg_console_out", payload={},
                                                  status="failed", retry_until="2026-12-08T00:00:00Z")
    DeliveryAttempt.all_tenants.create(tenant=world.tenant, delivery=delivery, status_code=503)
    mine = _console(world.admin)
    assert "cipher-xyz" not in mine.get(f"/admin/automations/webhooksubscription/{subscription.pk}/change/").content.decode()
    page = mine.get(f"/admin/automations/webhookdelivery/{delivery.pk}/change/").content.decode()
    assert "msg_console_out" in page and "503" in page
    resp = mine.post("/admin/automations/webhookdelivery/", {"action": "redeliver", "_selected_action": [delivery.pk]})
    assert resp.status_code == 302
    delivery.refresh_from_db()
    assert delivery.status == "pending"
    theirs = _console(other_world.admin)
    assert "msg_console_out" not in theirs.get("/admin/automations/webhookdelivery/").content.decode()
