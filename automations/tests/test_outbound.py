"""Outbound webhook subscriptions: deliveries to a local HTTP receiver, signed per Standard
Webhooks (verified with the ``standardwebhooks`` package, the receiver's side), retried with
backoff, given up after 24 hours, a 410 disables the subscription, addresses checked at save
and at delivery, the delivery log and redeliver; a run's end reaches the receiver end to end."""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from agents.tests.factories import AgentFactory, agent_with_route
from automations.models import (
    DeliveryStatus,
    Schedule,
    WebhookDelivery,
    WebhookSubscription,
)
from automations.outbound import backoff_seconds, delivery_attempt, event_emit, subscription_create
from automations.services import schedules_tick
from llm.testing import Reply
from tenants.scoping import system_scope, tenant_scope


class Receiver:
    """A local HTTP endpoint: records each request (headers, body) and answers the next of
    ``statuses`` (then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def verified(self, secret: str, index: int = -1) -> dict:
        headers, body = self.requests[index]
        return Webhook(secret).verify(body.decode(), headers)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()


def _subscribe(world, receiver, types=("run.completed", "run.failed", "schedule.failed")):
    with tenant_scope(world.tenant.pk):
        return subscription_create(tenant=world.tenant, url=receiver.url, event_types=list(types))


def _delivery(pk):
    with system_scope():
        return WebhookDelivery.all_tenants.get(pk=pk)


@pytest.mark.django_db
class TestDelivery:
    def test_signed_delivery_verifies_with_the_standard_package(self, world, receiver):
        subscription, secret = _subscribe(world, receiver)
        [pk] = event_emit(tenant_id=world.tenant.pk, event_type="run.completed", data={"run_id": 7, "reply": "Done."})
        with tenant_scope(world.tenant.pk):
            assert delivery_attempt(delivery_id=pk) == DeliveryStatus.DELIVERED
        payload = receiver.verified(secret)
        assert payload["type"] == "run.completed" and payload["data"] == {"run_id": 7, "reply": "Done."}
        headers = receiver.requests[0][0]
        assert headers["webhook-id"] == _delivery(pk).message_id
        with pytest.raises(Exception, match="signature"):
            Webhook(_subscribe(world, receiver)[1]).verify(receiver.requests[0][1].decode(), headers)
        with system_scope():
            [attempt] = _delivery(pk).attempt_log.all()
        assert attempt.status_code == 200 and attempt.error == ""

    def test_only_subscribed_types_and_active_subscriptions_get_deliveries(self, world, receiver):
        _subscribe(world, receiver, types=["run.failed"])
        assert event_emit(tenant_id=world.tenant.pk, event_type="run.completed", data={}) == []
        assert len(event_emit(tenant_id=world.tenant.pk, event_type="run.failed", data={})) == 1

    def test_failures_retry_with_backoff_and_the_same_id_then_succeed(self, world, receiver):
        _, secret = _subscribe(world, receiver)
        receiver.statuses = [500, 503]
        [pk] = event_emit(tenant_id=world.tenant.pk, event_type="run.failed", data={"run_id": 1})
        now = timezone.now()
        with tenant_scope(world.tenant.pk):
            assert delivery_attempt(delivery_id=pk, now=now) == DeliveryStatus.PENDING
            first = _delivery(pk).next_attempt_at
            assert now + timedelta(seconds=30) <= first < now + timedelta(seconds=90)
            assert delivery_attempt(delivery_id=pk, now=now + timedelta(seconds=10)) is None  # not due yet
            assert delivery_attempt(delivery_id=pk, now=first) == DeliveryStatus.PENDING
            second = _delivery(pk).next_attempt_at
            assert first + timedelta(seconds=60) <= second < first + timedelta(seconds=180)
            assert delivery_attempt(delivery_id=pk, now=second) == DeliveryStatus.DELIVERED
        ids = {headers["webhook-id"] for headers, _ in receiver.requests}
        assert len(receiver.requests) == 3 and len(ids) == 1
        with system_scope():
            assert [a.status_code for a in _delivery(pk).attempt_log.order_by("pk")] == [500, 503, 200]

    def test_gives_up_after_24_hours(self, world, receiver):
        _subscribe(world, receiver)
        receiver.statuses = [500] * 3
        [pk] = event_emit(tenant_id=world.tenant.pk, event_type="run.failed", data={})
        with tenant_scope(world.tenant.pk):
            later = timezone.now() + timedelta(hours=23, minutes=59, seconds=30)
            assert delivery_attempt(delivery_id=pk, now=later) == DeliveryStatus.FAILED

    def test_410_disables_the_subscription(self, world, receiver):
        subscription, _ = _subscribe(world, receiver)
        receiver.statuses = [410]
        [pk] = event_emit(tenant_id=world.tenant.pk, event_type="run.failed", data={})
        with tenant_scope(world.tenant.pk):
            assert delivery_attempt(delivery_id=pk) == DeliveryStatus.FAILED
            subscription.refresh_from_db()
        assert not subscription.is_active and "410" in subscription.disabled_reason
        assert event_emit(tenant_id=world.tenant.pk, event_type="run.failed", data={}) == []

    def test_address_is_checked_at_delivery_too(self, world, receiver):
        subscription, _ = _subscribe(world, receiver)
        with system_scope():  # changed behind the API's back (the save check cannot see it)
            WebhookSubscription.all_tenants.filter(pk=subscription.pk).update(url="http://169.254.169.254/latest/")
        [pk] = event_emit(tenant_id=world.tenant.pk, event_type="run.failed", data={})
        with tenant_scope(world.tenant.pk):
            assert delivery_attempt(delivery_id=pk) == DeliveryStatus.PENDING
        with system_scope():
            [attempt] = _delivery(pk).attempt_log.all()
        assert attempt.status_code is None and "metadata" in attempt.error
        assert receiver.requests == []

    def test_failed_schedule_slot_is_an_event(self, world, receiver, no_enqueue):
        _, secret = _subscribe(world, receiver)
        with system_scope():
            agent = AgentFactory(tenant=world.tenant, is_active=False)
            Schedule.all_tenants.create(tenant=world.tenant, agent=agent, owner=world.member, cron="* * * * *",
                                        message="x", next_slot_at=timezone.now().replace(second=0, microsecond=0))
        assert schedules_tick()["failed"] == 1
        with system_scope():
            delivery = WebhookDelivery.all_tenants.get(event_type="schedule.failed")
        assert "not active" in delivery.payload["data"]["error"]


def test_backoff_grows_and_is_jittered_up_to_six_hours():
    rng = random.Random(4)
    waits = [backoff_seconds(n, rng=rng) for n in range(1, 16)]
    assert 30 <= waits[0] < 90 and 60 <= waits[1] < 180 and 120 <= waits[2] < 360
    assert all(3 * 3600 <= w < 9 * 3600 for w in waits[10:])
    assert len({round(w, 3) for w in waits}) == len(waits)


@pytest.mark.django_db
@pytest.mark.usefixtures("all_tenants_scope")
class TestApi:
    def test_admin_api_and_redeliver(self, world, other_world, receiver):
        client = world.client(admin=True)
        assert world.client().get("/api/v1/admin/webhook-subscriptions/").status_code == 403
        bad = client.post("/api/v1/admin/webhook-subscriptions/",
                          {"url": "http://169.254.169.254/", "event_types": ["run.completed"]}, format="json")
        assert bad.status_code == 400 and "metadata" in bad.json()["message"]
        bad = client.post("/api/v1/admin/webhook-subscriptions/", {"url": receiver.url, "event_types": ["nope"]},
                          format="json")
        assert bad.status_code == 400 and "Unknown event types" in bad.json()["message"]
        created = client.post("/api/v1/admin/webhook-subscriptions/",
                              {"url": receiver.url, "event_types": ["run.completed"]}, format="json")
        assert created.status_code == 201, created.content
        secret, sub_id = created.json()["secret"], created.json()["id"]
        assert "secret" not in client.get(f"/api/v1/admin/webhook-subscriptions/{sub_id}/").json()
        [pk] = event_emit(tenant_id=world.tenant.pk, event_type="run.completed", data={"run_id": 1})
        with tenant_scope(world.tenant.pk):
            delivery_attempt(delivery_id=pk)
        log = client.get(f"/api/v1/admin/webhook-subscriptions/{sub_id}/deliveries/").json()
        assert log[0]["status"] == "delivered" and log[0]["attempt_log"][0]["status_code"] == 200
        again = client.post(f"/api/v1/admin/webhook-deliveries/{pk}/redeliver/")
        assert again.status_code == 202 and again.json()["status"] == "pending"
        with tenant_scope(world.tenant.pk):
            assert delivery_attempt(delivery_id=pk) == DeliveryStatus.DELIVERED
        assert len(receiver.requests) == 2 and receiver.verified(secret)["data"] == {"run_id": 1}
        theirs = other_world.client(admin=True)
        assert theirs.get(f"/api/v1/admin/webhook-subscriptions/{sub_id}/").status_code == 404
        assert theirs.delete(f"/api/v1/admin/webhook-subscriptions/{sub_id}/").status_code == 404
        assert theirs.get(f"/api/v1/admin/webhook-deliveries/{pk}/").status_code == 404
        assert theirs.post(f"/api/v1/admin/webhook-deliveries/{pk}/redeliver/").status_code == 404
        assert theirs.get("/api/v1/admin/webhook-deliveries/").json()["count"] == 0


def test_completed_run_reaches_the_receiver(world, fake_llm, celery_worker, receiver):
    """End to end: a message posted in the API, its run on the worker (the fake model), the
    run's end through the sessions port, the delivery task, the receiver."""
    with system_scope():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    _, secret = _subscribe(world, receiver)
    fake_llm.script(Reply("All green."))
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    run = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "status?"}, format="json").json()["run"]
    deadline = time.monotonic() + 30
    while not receiver.requests and time.monotonic() < deadline:
        time.sleep(0.1)
    payload = receiver.verified(secret)
    assert payload["type"] == "run.completed"
    assert payload["data"]["run_id"] == run["id"] and payload["data"]["reply"] == "All green."
    assert json.loads(receiver.requests[0][1])["data"]["run_id"] == run["id"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("all_tenants_scope")
def test_approval_request_and_run_end_become_events(world, fake_llm, no_enqueue, receiver, monkeypatch):
    """The runner's pause for an approval and the run's end reach the sessions port: an
    ``approval.requested`` and then a ``run.completed`` delivery (attempted here, not queued)."""
    from asgiref.sync import async_to_sync

    from agents.tests.factories import bind_builtin
    from llm.testing import ToolCalls
    from sessions.runner.loop import execute_run
    from sessions.runs.approvals import approval_decide
    from sessions.tests.conftest import post_message_sync

    monkeypatch.setattr("automations.outbound._enqueue", lambda ids, tenant_id: None)
    _, secret = _subscribe(world, receiver, types=["approval.requested", "run.completed"])
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("The echo said ping."))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    async_to_sync(execute_run)(run.pk)
    [requested] = WebhookDelivery.all_tenants.filter(event_type="approval.requested")
    approval = requested.payload["data"]["approvals"][0]
    assert requested.payload["data"]["run_id"] == run.pk and approval["tool_name"] == "test_echo"
    from sessions.models import Approval

    with tenant_scope(world.tenant.pk):
        approval_decide(approval=Approval.objects.get(pk=approval["approval_id"]), user=world.member,
                        decision="approve")
    async_to_sync(execute_run)(run.pk)
    [completed] = WebhookDelivery.all_tenants.filter(event_type="run.completed")
    assert completed.payload["data"] == {"run_id": run.pk, "reply": "The echo said ping."}
    with tenant_scope(world.tenant.pk):
        assert delivery_attempt(delivery_id=requested.pk) == DeliveryStatus.DELIVERED
    assert receiver.verified(secret)["type"] == "approval.requested"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("all_tenants_scope")
def test_a_run_end_skips_the_observers_when_nothing_wants_it(world, fake_llm, no_enqueue, monkeypatch):
    """A run's end calls the run-event observers (on a database thread) only when one may act:
    not for a tenant known to have no subscription and a run without a push config; again once
    the tenant subscribes, and for a run with a push config (issue 39's guard: the hop and its
    queries were the worker's added CPU per run)."""
    from asgiref.sync import async_to_sync

    from automations import outbound
    from sessions.models import TaskPushConfig
    from sessions.runner.loop import execute_run
    from sessions.runs import ending
    from sessions.tests.conftest import post_message_sync

    observed: list[int] = []
    monkeypatch.setattr(ending, "run_event_observe", lambda tenant_id, run_id, *a: observed.append(run_id))
    outbound._subscribes.clear()
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.respond(lambda body: Reply("ok"))

    def ended_run() -> int:
        run = post_message_sync(agent=agent, user=world.member, content="hi")
        async_to_sync(execute_run)(run.pk)
        return run.pk

    first = ended_run()  # the tenant's subscriptions not yet known: the observers look
    with tenant_scope(world.tenant.pk):
        assert outbound._tenant_subscribes(world.tenant.pk) is False  # now cached
    second = ended_run()
    pushed = post_message_sync(agent=agent, user=world.member, content="push me")
    with tenant_scope(world.tenant.pk):
        TaskPushConfig.objects.create(tenant_id=world.tenant.pk, run=pushed, config_id="c1",
                                      url="https://receiver.example/hook")
    async_to_sync(execute_run)(pushed.pk)
    assert observed == [first, pushed.pk]
    assert second not in observed


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("all_tenants_scope")
def test_a_run_pause_skips_the_observers_when_nothing_wants_it(world, fake_llm, no_enqueue, monkeypatch):
    """A run's pause for an approval makes the same check as its end: no database-thread hop to
    the observers for a tenant known to have no subscription and a run without a push config;
    one for a run with a push config."""
    from asgiref.sync import async_to_sync

    from agents.tests.factories import bind_builtin
    from automations import outbound
    from llm.testing import ToolCalls
    from sessions.models import Run, RunStatus, TaskPushConfig
    from sessions.runner.loop import execute_run
    from sessions.runs import transitions
    from sessions.tests.conftest import post_message_sync

    observed: list[tuple[int, str]] = []
    monkeypatch.setattr(transitions, "run_event_observe",
                        lambda tenant_id, run_id, event_type, data: observed.append((run_id, event_type)))
    outbound._subscribes.clear()
    with tenant_scope(world.tenant.pk):
        assert outbound._tenant_subscribes(world.tenant.pk) is False  # known: no subscription
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_*", "action": "ask"}])
    fake_llm.respond(lambda body: ToolCalls([("test_echo", {"text": "ping"})]))

    quiet = post_message_sync(agent=agent, user=world.member, content="no push")
    async_to_sync(execute_run)(quiet.pk)
    pushed = post_message_sync(agent=agent, user=world.member, content="push me")
    with tenant_scope(world.tenant.pk):
        TaskPushConfig.objects.create(tenant_id=world.tenant.pk, run=pushed, config_id="c1",
                                      url="https://receiver.example/hook")
    async_to_sync(execute_run)(pushed.pk)
    statuses = dict(Run.all_tenants.filter(pk__in=[quiet.pk, pushed.pk]).values_list("pk", "status"))
    assert statuses == {quiet.pk: RunStatus.AWAITING_APPROVAL, pushed.pk: RunStatus.AWAITING_APPROVAL}
    assert observed == [(pushed.pk, "run_awaiting_approval")]
