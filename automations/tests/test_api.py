"""The schedules and webhook-triggers API: members manage their own for the tenant's agents,
admins all of the tenant's; nothing of another tenant's is seen, changed or pointed at."""

from __future__ import annotations

from datetime import datetime

import pytest

from agents.tests.factories import AgentFactory
from automations.models import Schedule, ScheduleSlot, SlotStatus, WebhookTrigger
from sessions.models import ChatSession
from tenants.crypto import secret_decrypt

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _body(agent, **fields):
    body = {"agent": agent.pk, "cron": "0 8 * * 1-5", "timezone": "Europe/Berlin", "message": "Morning report"}
    body.update(fields)
    return body


def test_member_creates_a_schedule_and_sees_its_next_runs(world):
    agent = AgentFactory(tenant=world.tenant)
    client = world.client()
    created = client.post("/api/v1/schedules/", _body(agent), format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert data["owner"] == world.member.pk and data["missed_policy"] == "skip" and data["chat_mode"] == "new"
    runs = [datetime.fromisoformat(value) for value in data["next_runs"]]
    assert len(runs) == 5 and runs == sorted(runs)
    assert all(r.hour == 8 and r.minute == 0 and r.weekday() < 5 for r in runs)  # Berlin wall clock
    assert str(runs[0].utcoffset()) in {"1:00:00", "2:00:00"}
    paused = client.patch(f"/api/v1/schedules/{data['id']}/", {"paused": True}, format="json")
    assert paused.status_code == 200 and paused.json()["next_runs"] == []
    assert Schedule.all_tenants.get(pk=data["id"]).next_slot_at is None
    resumed = client.patch(f"/api/v1/schedules/{data['id']}/", {"paused": False}, format="json").json()
    assert resumed["next_runs"] == data["next_runs"] or len(resumed["next_runs"]) == 5
    assert client.get("/api/v1/schedules/").json()["count"] == 1


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cron": "61 8 * * *"}, "Invalid cron expression"),
        ({"cron": "0 8 * *"}, "five fields"),
        ({"timezone": "Mars/Olympus"}, "Unknown time zone"),
        ({"message": "   "}, "may not be blank"),
        ({"chat_mode": "fixed"}, "needs a chat"),
        ({"missed_policy": "twice"}, "valid choice"),
    ],
)
def test_bad_schedules_are_400_with_a_message(world, fields, words):
    agent = AgentFactory(tenant=world.tenant)
    resp = world.client().post("/api/v1/schedules/", _body(agent, **fields), format="json")
    assert resp.status_code == 400, resp.content
    assert words in str(resp.json())


def test_fixed_chat_must_be_the_owners(world):
    agent = AgentFactory(tenant=world.tenant)
    admins_chat = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.admin)
    resp = world.client().post(
        "/api/v1/schedules/", _body(agent, chat_mode="fixed", chat=admins_chat.pk), format="json"
    )
    assert resp.status_code == 400 and "owner's chats" in resp.json()["message"]
    mine = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    resp = world.client().post("/api/v1/schedules/", _body(agent, chat_mode="fixed", chat=mine.pk), format="json")
    assert resp.status_code == 201 and resp.json()["chat"] == mine.pk


def test_members_see_their_own_admins_see_all(world):
    agent = AgentFactory(tenant=world.tenant)
    member_id = world.client().post("/api/v1/schedules/", _body(agent), format="json").json()["id"]
    admin_id = world.client(admin=True).post("/api/v1/schedules/", _body(agent), format="json").json()["id"]
    member = world.client()
    assert [s["id"] for s in member.get("/api/v1/schedules/").json()["results"]] == [member_id]
    assert member.get(f"/api/v1/schedules/{admin_id}/").status_code == 404
    assert member.delete(f"/api/v1/schedules/{admin_id}/").status_code == 404
    admin = world.client(admin=True)
    assert {s["id"] for s in admin.get("/api/v1/schedules/").json()["results"]} == {member_id, admin_id}
    assert admin.patch(f"/api/v1/schedules/{member_id}/", {"message": "Changed"}, format="json").status_code == 200
    assert Schedule.all_tenants.get(pk=member_id).owner_id == world.member.pk  # the owner stays
    other_agent = AgentFactory(tenant=world.tenant)
    other_id = admin.post("/api/v1/schedules/", _body(other_agent), format="json").json()["id"]
    listed = admin.get("/api/v1/schedules/", {"agent": agent.pk, "mine": "true"}).json()["results"]
    assert [s["id"] for s in listed] == [admin_id]  # the chat app's "Scheduled" on an agent
    assert [s["id"] for s in admin.get("/api/v1/schedules/", {"agent": other_agent.pk}).json()["results"]] == [other_id]
    bad = admin.get("/api/v1/schedules/", {"agent": "x"})
    assert bad.status_code == 400 and "agent" in bad.json()["message"] + str(bad.json().get("extra"))


def test_slots_show_the_reason_a_start_failed(world):
    agent = AgentFactory(tenant=world.tenant)
    schedule_id = world.client().post("/api/v1/schedules/", _body(agent), format="json").json()["id"]
    ScheduleSlot.all_tenants.create(
        tenant=world.tenant,
        schedule_id=schedule_id,
        slot_time="2026-12-07T07:00:00Z",
        status=SlotStatus.FAILED,
        error="The schedule's agent is not active.",
    )
    slots = world.client().get(f"/api/v1/schedules/{schedule_id}/slots/").json()
    assert slots[0]["status"] == "failed" and "not active" in slots[0]["error"]


def test_other_tenants_schedules_and_triggers_are_404(world, other_world):
    theirs_agent = AgentFactory(tenant=other_world.tenant)
    theirs = other_world.client(admin=True).post("/api/v1/schedules/", _body(theirs_agent), format="json").json()
    trigger = (
        other_world.client(admin=True)
        .post("/api/v1/webhook-triggers/", {"agent": theirs_agent.pk}, format="json")
        .json()
    )
    for client in (world.client(), world.client(admin=True)):
        for url in (f"/api/v1/schedules/{theirs['id']}/", f"/api/v1/webhook-triggers/{trigger['id']}/"):
            assert client.get(url).status_code == 404
            assert client.patch(url, {"name": "hijacked"}, format="json").status_code == 404
            assert client.delete(url).status_code == 404
        assert client.get(f"/api/v1/schedules/{theirs['id']}/slots/").status_code == 404
        assert client.post(f"/api/v1/webhook-triggers/{trigger['id']}/rotate-secret/").status_code == 404
        assert client.get("/api/v1/schedules/").json()["count"] == 0
        assert client.get("/api/v1/webhook-triggers/").json()["count"] == 0
        pointed = client.post("/api/v1/schedules/", _body(theirs_agent), format="json")
        assert pointed.status_code == 400 and "agent" in pointed.json()["extra"]["fields"]
        pointed = client.post("/api/v1/webhook-triggers/", {"agent": theirs_agent.pk}, format="json")
        assert pointed.status_code == 400
    assert Schedule.all_tenants.get(pk=theirs["id"]).name == ""


def test_trigger_secret_is_shown_once_and_stored_encrypted(world):
    agent = AgentFactory(tenant=world.tenant)
    client = world.client()
    created = client.post(
        "/api/v1/webhook-triggers/", {"agent": agent.pk, "template": "New issue: {{ issue.title }}"}, format="json"
    )
    assert created.status_code == 201, created.content
    data = created.json()
    secret = data["secret"]
    assert secret.startswith("whsec_") and data["url"] == f"/hooks/{data['id']}/"
    row = WebhookTrigger.all_tenants.get(pk=data["id"])
    assert secret not in row.secret_encrypted
    assert secret_decrypt(tenant=world.tenant, ciphertext=row.secret_encrypted) == secret
    shown = client.get(f"/api/v1/webhook-triggers/{data['id']}/").json()
    assert "secret" not in shown and secret not in str(client.get("/api/v1/webhook-triggers/").json())
    rotated = client.post(f"/api/v1/webhook-triggers/{data['id']}/rotate-secret/").json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != secret
    bad = client.post(
        "/api/v1/webhook-triggers/", {"agent": agent.pk, "template": "{{ issue['title'] }}"}, format="json"
    )
    assert bad.status_code == 400 and "dotted path" in bad.json()["message"]


@pytest.mark.parametrize("path", ["/api/v1/schedules/0/", "/api/v1/webhook-triggers/e3e70682-c209-1cac-a29f-6fbed82c07cd/"])
def test_options_on_a_detail_url_is_not_a_500(world, path):
    # DRF's OPTIONS metadata calls get_queryset on a clone of the request: the caller's
    # membership must be readable there too (schemathesis found the 500).
    resp = world.client().options(path)
    assert resp.status_code in (200, 404), resp.content
