"""The audit log (issue 23): admin writes from the console and the API, and security events,
each leave one event with actor, tenant, time, object and change (never a secret's value);
a tenant admin reads only their tenant's log and cannot write it."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents.tests.factories import ProviderFactory
from tenants.models import AuditEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _events(tenant, **filters):
    return list(AuditEvent.all_tenants.filter(tenant=tenant, **filters).order_by("id"))


def test_a_console_change_leaves_one_event_without_the_secret(world):
    provider = ProviderFactory(tenant=world.tenant, name="old-name")
    before = AuditEvent.all_tenants.count()
    resp = _console(world.admin).post(f"/admin/llm/modelprovider/{provider.pk}/change/", {
        "name": "new-name", "api": "openai", "base_url": provider.base_url, "api_key": "sk-console-secret-123",
    })
    assert resp.status_code == 302, resp.content.decode()[:3000]
    assert AuditEvent.all_tenants.count() == before + 1
    [event] = _events(world.tenant, object_type="llm.modelprovider")
    assert (event.action, event.source, event.actor_id, event.object_id) == (
        "update", "console", world.admin.pk, str(provider.pk))
    assert event.changes["name"] == {"from": "old-name", "to": "new-name"}
    assert event.changes["api_key"] == {"changed": True}
    assert event.ip_address == "127.0.0.1" and event.at is not None
    assert "sk-console-secret-123" not in json.dumps([event.changes, event.detail])


def test_a_console_delete_leaves_one_event(world):
    provider = ProviderFactory(tenant=world.tenant)
    resp = _console(world.admin).post(f"/admin/llm/modelprovider/{provider.pk}/delete/", {"post": "yes"})
    assert resp.status_code == 302
    [event] = _events(world.tenant, object_type="llm.modelprovider")
    assert (event.action, event.object_repr) == ("delete", provider.name)


def test_an_api_change_leaves_one_event_without_the_secret(world):
    provider = ProviderFactory(tenant=world.tenant, name="api-old")
    before = AuditEvent.all_tenants.count()
    resp = world.client(admin=True).patch(f"/api/v1/admin/providers/{provider.pk}/",
                                          {"name": "api-new", "api_key": "sk-api-secret-456"}, format="json")
    assert resp.status_code == 200, resp.content
    assert AuditEvent.all_tenants.count() == before + 1
    [event] = _events(world.tenant, object_type="llm.modelprovider")
    assert (event.action, event.source, event.actor_id) == ("update", "api", world.admin.pk)
    assert event.changes["name"] == {"from": "api-old", "to": "api-new"}
    assert event.changes["api_key_encrypted"] == {"changed": True}
    assert event.detail["fields_sent"] == ["api_key", "name"]
    assert "sk-api-secret-456" not in json.dumps([event.changes, event.detail])

    created = world.client(admin=True).post("/api/v1/admin/providers/", {
        "name": "p2", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-other"}, format="json")
    assert created.status_code == 201, created.content
    deleted = world.client(admin=True).delete(f"/api/v1/admin/providers/{created.json()['id']}/")
    assert deleted.status_code == 204
    actions = [e.action for e in _events(world.tenant, object_type="llm.modelprovider")]
    assert actions == ["update", "create", "delete"]


def test_a_refused_api_write_leaves_no_event(world):
    before = AuditEvent.all_tenants.count()
    resp = world.client(admin=True).post("/api/v1/admin/providers/", {"name": ""}, format="json")
    assert resp.status_code == 400
    assert AuditEvent.all_tenants.count() == before


def test_a_failed_login_leaves_one_event(world):
    from rest_framework.test import APIClient

    resp = APIClient().post("/api/v1/auth/login/", {"username": world.member.username, "password": "nope"},
                            format="json")
    assert resp.status_code == 400
    [event] = _events(world.tenant, action="login_failed")
    assert (event.object_type, event.object_id, event.source) == ("auth.user", str(world.member.pk), "auth")
    assert event.detail["username"] == world.member.username and "nope" not in json.dumps(event.detail)


def test_a_token_revoke_leaves_one_event(world):
    client = world.client()
    issued = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    [issue] = _events(world.tenant, action="token_issued", object_id=str(issued["id"]))
    assert issue.actor_id == world.member.pk and issued["token"] not in json.dumps([issue.changes, issue.detail])
    assert client.post(f"/api/v1/tokens/{issued['id']}/revoke/").status_code == 200
    assert client.post(f"/api/v1/tokens/{issued['id']}/revoke/").status_code == 200  # idempotent
    [event] = _events(world.tenant, action="token_revoked")
    assert (event.object_id, event.actor_id, event.source) == (str(issued["id"]), world.member.pk, "api")


def test_a_device_pairing_leaves_events(world):
    from rest_framework.test import APIClient

    pairing = APIClient().post("/api/v1/browser/pairings/", {"name": "Laptop"}, format="json").json()
    assert world.client().post("/api/v1/browser/pairings/approve/", {"code": pairing["code"]},
                               format="json").status_code == 200
    answer = APIClient().post(f"/api/v1/browser/pairings/{pairing['pairing_id']}/token/",
                              {"poll_secret": pairing["poll_secret"]}, format="json").json()
    [approved] = _events(world.tenant, action="device_pairing_approved")
    [paired] = _events(world.tenant, action="device_paired")
    assert approved.actor_id == paired.actor_id == world.member.pk
    assert paired.object_id == str(answer["device"]["id"]) and answer["token"] not in json.dumps(paired.detail)
    assert world.client().delete(f"/api/v1/browser/devices/{answer['device']['id']}/").status_code == 204
    assert len(_events(world.tenant, action="device_revoked")) == 1


def test_membership_changes_in_the_console_leave_events(world):
    membership = world.member_membership
    resp = _console(world.admin).post(f"/admin/tenants/membership/{membership.pk}/change/", {"role": "admin"})
    assert resp.status_code == 302
    [event] = _events(world.tenant, object_type="tenants.membership", source="console")
    assert event.action == "update" and event.changes["role"] == {"from": "member", "to": "admin"}


# --- reading the log: the tenant's own, read-only ----------------------------------------------


def _some_events(world, other_world):
    ProviderFactory(tenant=other_world.tenant)
    other_world.client(admin=True).post("/api/v1/admin/providers/", {
        "name": "globex-secret-provider", "base_url": "http://127.0.0.1:9/v1"}, format="json")
    world.client(admin=True).post("/api/v1/admin/providers/", {
        "name": "acme-provider", "base_url": "http://127.0.0.1:9/v1"}, format="json")


def test_api_audit_log_shows_the_tenants_events_only(world, other_world):
    _some_events(world, other_world)
    resp = world.client(admin=True).get("/api/v1/admin/audit/")
    assert resp.status_code == 200
    body = resp.json()
    assert {"count", "next", "previous", "results"} <= set(body)
    reprs = [e["object_repr"] for e in body["results"]]
    assert "acme-provider" in reprs and "globex-secret-provider" not in reprs
    ids = set(AuditEvent.all_tenants.filter(tenant=world.tenant).values_list("id", flat=True))
    assert {e["id"] for e in body["results"]} <= ids
    filtered = world.client(admin=True).get("/api/v1/admin/audit/?action=create&object_type=llm.modelprovider")
    assert [e["object_repr"] for e in filtered.json()["results"]] == ["acme-provider"]
    by_actor = world.client(admin=True).get(f"/api/v1/admin/audit/?actor={world.admin.pk}").json()["results"]
    assert by_actor and all(e["actor"] == world.admin.pk for e in by_actor)
    assert world.client(admin=True).get("/api/v1/admin/audit/?actor=x").status_code == 400
    # members cannot read it; nobody can write it
    assert world.client().get("/api/v1/admin/audit/").status_code == 403
    assert world.client(admin=True).post("/api/v1/admin/audit/", {}, format="json").status_code == 405


def test_console_audit_log_is_the_tenants_and_read_only(world, other_world):
    _some_events(world, other_world)
    console = _console(world.admin)
    listing = console.get("/admin/tenants/auditevent/")
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "acme-provider" in html and "globex-secret-provider" not in html
    theirs = AuditEvent.all_tenants.filter(tenant=other_world.tenant).first()
    ours = AuditEvent.all_tenants.filter(tenant=world.tenant).first()
    assert console.get(f"/admin/tenants/auditevent/{theirs.pk}/change/").status_code in (302, 404)
    assert console.get(f"/admin/tenants/auditevent/{ours.pk}/change/").status_code == 200  # read-only view
    assert console.get("/admin/tenants/auditevent/add/").status_code == 403
    assert console.post(f"/admin/tenants/auditevent/{ours.pk}/change/", {"action": "x"}).status_code == 403
    assert console.post(f"/admin/tenants/auditevent/{ours.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditEvent.all_tenants.filter(pk=ours.pk, action=ours.action).exists()
    # events of no tenant (a failed login of an unknown name) are superusers' only
    from rest_framework.test import APIClient

    APIClient().post("/api/v1/auth/login/", {"username": "nobody-here", "password": "x"}, format="json")
    nameless = AuditEvent.all_tenants.get(detail__username="nobody-here")
    assert console.get(f"/admin/tenants/auditevent/{nameless.pk}/change/").status_code in (302, 404)


@pytest.mark.django_db(transaction=True)
def test_an_approval_decision_leaves_one_event(world, fake_llm, no_enqueue):
    from asgiref.sync import async_to_sync

    from agents.tests.factories import agent_with_route, bind_builtin
    from llm.testing import Reply, ToolCalls
    from sessions.models import Approval
    from sessions.runner.loop import execute_run
    from sessions.tests.conftest import post_message_sync

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("done"))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    async_to_sync(execute_run)(run.pk)
    approval = Approval.all_tenants.get(run_id=run.pk)
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "deny", "reason": "over budget"},
                               format="json")
    assert resp.status_code == 200, resp.content
    [event] = _events(world.tenant, action="approval_decided")
    assert (event.object_type, event.object_id, event.actor_id) == ("agent_sessions.approval", str(approval.pk),
                                                                    world.member.pk)
    assert event.changes["status"] == {"from": "pending", "to": "denied"}
    # Why, too (issue 39: the decision, who made it and why); a question's answer never is.
    assert event.detail["reason"] == "over budget" and event.detail["kind"] == "tool_call"


def test_console_admins_without_the_mixin_are_recorded_through_their_log_entry(world):
    from django.contrib.admin.models import CHANGE, LogEntry

    LogEntry.objects.log_actions(user_id=world.admin.pk, queryset=[world.tenant], action_flag=CHANGE,
                                 change_message=[{"changed": {"fields": ["Name"]}}], single_object=True)
    [event] = _events(world.tenant, object_type="tenants.tenant")
    assert (event.action, event.source, event.actor_id) == ("update", "console", world.admin.pk)
