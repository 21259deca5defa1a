"""``POST /hooks/<trigger id>/``: requests signed with the ``standardwebhooks`` package (the
sender's side of Standard Webhooks) start a run; bad, expired, replayed or malformed requests
are refused with a 4xx and start nothing."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from standardwebhooks.webhooks import Webhook

from agents.tests.factories import AgentFactory, agent_with_route
from automations.models import InboundWebhook, WebhookTrigger
from automations.services import PayloadInvalid, template_render, trigger_create
from llm.testing import Reply
from sessions.models import Run
from sessions.tests.test_api_flow import wait_for_run
from tenants.scoping import system_scope

PAYLOAD = {"action": "opened", "issue": {"title": "Login broken", "labels": ["bug", "p1"]}}
TEMPLATE = "Triage issue {{ issue.title }} ({{ action }}, first label {{ issue.labels.0 }})"


def _trigger(world, agent=None, template=TEMPLATE):
    with system_scope():
        agent = agent or AgentFactory(tenant=world.tenant)
        return trigger_create(tenant=world.tenant, owner=world.member, agent=agent, name="issues", template=template)


def _post(trigger, secret, body, *, msg_id=None, at=None, signature=None):
    text = body if isinstance(body, str) else json.dumps(body)
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    at = at or datetime.now(tz=UTC)
    if signature is None:
        signature = Webhook(secret).sign(msg_id, at, text)
    return Client().post(
        f"/hooks/{trigger.pk}/",
        data=text,
        content_type="application/json",
        headers={"webhook-id": msg_id, "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": signature},
    )


def _runs():
    with system_scope():
        return list(Run.all_tenants.order_by("pk"))


@pytest.mark.django_db
@pytest.mark.usefixtures("no_enqueue")
class TestInbound:
    def test_signed_request_starts_a_run_with_the_rendered_message(self, world):
        trigger, secret = _trigger(world)
        resp = _post(trigger, secret, PAYLOAD, msg_id="msg_1")
        assert resp.status_code == 202, resp.content
        data = resp.json()
        [run] = _runs()
        assert data == {"run_id": run.pk, "chat_id": run.session_id}
        assert run.input == "Triage issue Login broken (opened, first label bug)"
        assert run.user_id == world.member.pk and run.tenant_id == world.tenant.pk
        assert run.purpose == "webhook"

    def test_replayed_webhook_id_starts_no_second_run(self, world):
        trigger, secret = _trigger(world)
        first = _post(trigger, secret, PAYLOAD, msg_id="msg_same").json()
        again = _post(trigger, secret, PAYLOAD, msg_id="msg_same")
        assert again.status_code == 200 and again.json() == {**first, "replayed": True}
        assert len(_runs()) == 1
        assert _post(trigger, secret, PAYLOAD, msg_id="msg_other").status_code == 202
        assert len(_runs()) == 2

    @pytest.mark.parametrize("case", ["wrong_secret", "tampered_body", "old", "future", "garbage", "missing"])
    def test_bad_signatures_are_401(self, world, case):
        trigger, secret = _trigger(world)
        other_secret = _trigger(world)[1]
        at = datetime.now(tz=UTC)
        kwargs = {
            "wrong_secret": {
                "signature": Webhook(other_secret).sign("msg_x", at, json.dumps(PAYLOAD)),
                "msg_id": "msg_x",
            },
            "tampered_body": {"signature": Webhook(secret).sign("msg_x", at, json.dumps({"a": 1})), "msg_id": "msg_x"},
            "old": {"at": at - timedelta(minutes=6)},
            "future": {"at": at + timedelta(minutes=6)},
            "garbage": {"signature": "v1,not-base64!! v1"},
            "missing": {"signature": ""},
        }[case]
        resp = _post(trigger, secret, PAYLOAD, **kwargs)
        assert resp.status_code == 401, resp.content
        assert resp.json()["message"].startswith("Webhook signature refused")
        assert _runs() == []
        with system_scope():
            assert not InboundWebhook.all_tenants.exists()

    def test_payload_that_is_not_json_or_lacks_a_field_is_400(self, world):
        trigger, secret = _trigger(world)
        resp = _post(trigger, secret, "not json{", msg_id="msg_a")
        assert resp.status_code == 400 and resp.json()["message"] == "The body is not JSON."
        resp = _post(trigger, secret, {"action": "opened"}, msg_id="msg_b")
        assert resp.status_code == 400 and "no field 'issue.title'" in resp.json()["message"]
        resp = _post(trigger, secret, PAYLOAD, msg_id="m" * 256)
        assert resp.status_code == 400 and "webhook-id is longer" in resp.json()["message"]
        assert _runs() == []

    def test_unknown_or_inactive_trigger_is_404(self, world):
        trigger, secret = _trigger(world)
        missing = Client().post(f"/hooks/{uuid.uuid4()}/", data="{}", content_type="application/json")
        assert missing.status_code == 404
        assert Client().post("/hooks/not-a-uuid/", data="{}", content_type="application/json").status_code == 404
        with system_scope():
            WebhookTrigger.all_tenants.filter(pk=trigger.pk).update(is_active=False)
        assert _post(trigger, secret, PAYLOAD).status_code == 404
        assert Client().get(f"/hooks/{trigger.pk}/").status_code == 405

    def test_inactive_agent_is_409_and_the_id_can_be_retried(self, world):
        with system_scope():
            agent = AgentFactory(tenant=world.tenant)
        trigger, secret = _trigger(world, agent)
        with system_scope():
            type(agent).all_tenants.filter(pk=agent.pk).update(is_active=False)
        resp = _post(trigger, secret, PAYLOAD, msg_id="msg_retry")
        assert resp.status_code == 409 and "not active" in resp.json()["message"]
        with system_scope():
            type(agent).all_tenants.filter(pk=agent.pk).update(is_active=True)
        assert _post(trigger, secret, PAYLOAD, msg_id="msg_retry").status_code == 202


def test_template_reaches_json_values_only():
    assert template_render("{{ payload }}", {"a": [1, "x"]}) == '{"a": [1, "x"]}'
    assert template_render("{{a.b}} and {{ a.c }}", {"a": {"b": "text", "c": {"d": 1}}}) == 'text and {"d": 1}'
    for template in (
        "{{ a.__class__ }}",
        "{{ a.upper }}",
        "{{ a.__class__.__init__.__globals__ }}",
        "{{ items.5 }}",
        "{{ items.-1 }}",
    ):
        with pytest.raises(PayloadInvalid):
            template_render(template, {"a": "text", "items": [1]})
    assert template_render("{a.__class__} {0}", {"a": "x"}) == "{a.__class__} {0}"  # no str.format


def test_webhook_run_completes_on_the_fake_model(world, fake_llm, celery_worker):
    with system_scope():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.script(Reply("Triaged: P1, assigned to the auth team."))
    trigger, secret = _trigger(world, agent)
    resp = _post(trigger, secret, PAYLOAD)
    assert resp.status_code == 202, resp.content
    run = wait_for_run(world.client(), resp.json()["run_id"])
    assert run["status"] == "completed" and run["reply"] == "Triaged: P1, assigned to the auth team."
    assert fake_llm.requests[0]["messages"][-1]["content"] == "Triage issue Login broken (opened, first label bug)"
