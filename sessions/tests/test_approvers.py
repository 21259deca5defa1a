"""Approvals by the right person (issue 39): an ``ask`` rule's approvers (the requester, a role
of the tenant, named members), its message, timeout and ``on_timeout``; who may see and decide
through the API (the reviewer's inbox, ``?mine=approver``); the expiry deciding as the rule says;
the decision, decider and reason in the audit log, the trace and the outbound webhooks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.models import CapabilityBinding, approval_policy_errors
from agents.tests.factories import agent_with_route, bind_builtin
from automations.models import WebhookDelivery, WebhookSubscription
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.services import runs_sweep
from sessions.tests.conftest import post_message_sync
from sessions.trace_selectors import run_trace
from tenants.models import AuditEvent, Role
from tenants.services import membership_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)


# --- the rule's shape ------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "error"), [
    ({"pattern": "x", "action": "ask", "approvers": {"roles": ["boss"]}}, "Rule 1: 'approvers.roles' must be"),
    ({"pattern": "x", "action": "ask", "approvers": {"members": ["not-an-email"]}}, "'approvers.members' must be"),
    ({"pattern": "x", "action": "ask", "approvers": {"requester": False}}, "'approvers' names nobody"),
    ({"pattern": "x", "action": "ask", "approvers": {"team": []}}, "'approvers.team' is not a field"),
    ({"pattern": "x", "action": "ask", "timeout_seconds": 0}, "'timeout_seconds' must be a whole number"),
    ({"pattern": "x", "action": "ask", "timeout_seconds": "60"}, "'timeout_seconds' must be a whole number"),
    ({"pattern": "x", "action": "ask", "on_timeout": "ignore"}, "'on_timeout' must be one of deny, approve"),
    ({"pattern": "x", "action": "ask", "message": 5}, "'message' must be a text"),
    ({"pattern": "x", "action": "allow", "timeout_seconds": 60}, "'timeout_seconds' applies only to rules with action 'ask'"),
    ({"pattern": "x", "action": "ask", "timeout": 60}, "'timeout' is not a field of a rule"),
])
def test_a_bad_rule_field_is_named(rule, error):
    [message] = approval_policy_errors([rule])
    assert message.startswith("Rule 1:") and error.removeprefix("Rule 1: ") in message


def test_the_old_rule_shape_and_the_full_one_are_valid():
    assert approval_policy_errors([
        {"pattern": "delete_*", "action": "ask"},
        {"pattern": "pay_*", "action": "ask", "approvers": {"requester": True, "roles": ["admin"],
                                                             "members": [7, "ops@example.com"]},
         "message": "Payments need finance.", "timeout_seconds": 3 * 86400, "on_timeout": "deny"},
        {"pattern": "*", "action": "allow"},
    ]) == []


def test_a_binding_naming_someone_outside_the_tenant_is_refused(world, other_world, fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    policy = [{"pattern": "*", "action": "ask", "approvers": {"members": [other_world.admin.pk]}}]
    binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind="builtin", builtin_name="test_echo",
                                approval_policy=policy)
    with pytest.raises(ValidationError) as caught:
        binding.full_clean()
    assert f"'approvers.members' names no member of this tenant: {other_world.admin.pk}" in str(caught.value)
    binding.approval_policy = [{"pattern": "*", "action": "ask",
                                "approvers": {"members": [world.admin.pk, "nobody@example.com"]}}]
    with pytest.raises(ValidationError) as caught:
        binding.full_clean()
    assert "tenant: nobody@example.com." in str(caught.value)


# --- who decides -----------------------------------------------------------------------------


def _paused_run(world, fake_llm, policy, calls=(("test_echo", {"text": "ping"}),), bindings=("test_echo",)):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Payments")
    for name in bindings:
        bind_builtin(agent, name, approval_policy=policy)
    fake_llm.script(ToolCalls(list(calls)), Reply("Done."))
    run = post_message_sync(agent=agent, user=world.member, content="Go")
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"
    return run


def _subscribe(world, monkeypatch):
    """An outbound subscription to both approval events; deliveries written, never sent."""
    import automations.outbound

    monkeypatch.setattr("automations.outbound._enqueue", lambda ids, tenant_id: None)
    automations.outbound._subscribes.clear()
    WebhookSubscription.all_tenants.create(tenant=world.tenant, url="https://hooks.example.com/a", secret_encrypted="x",
                                           event_types=["approval.requested", "approval.decided"])


def test_a_reviewer_of_the_role_decides_where_the_requester_may_not(world, other_world, fake_llm, no_enqueue,
                                                                    monkeypatch):
    _subscribe(world, monkeypatch)
    rule = {"pattern": "test_*", "action": "ask", "approvers": {"roles": ["admin"]},
            "message": "Finance must approve echoes.", "timeout_seconds": 7200, "on_timeout": "deny"}
    run = _paused_run(world, fake_llm, [rule])
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    assert approval.approvers == {"requester": False, "roles": ["admin"], "user_ids": []}
    assert (approval.reason, approval.on_timeout) == ("Finance must approve echoes.", "deny")
    assert abs((approval.expires_at - approval.created_at) - timedelta(seconds=7200)) < timedelta(seconds=5)
    [requested] = WebhookDelivery.all_tenants.filter(event_type="approval.requested")
    assert requested.payload["data"]["approvals"][0]["approvers"]["roles"] == ["admin"]

    # The requester sees their pause but may not decide it.
    member = world.client()
    [own] = member.get("/api/v1/approvals/").json()
    assert (own["id"], own["can_decide"], own["reason"]) == (approval.pk, False, "Finance must approve echoes.")
    assert member.get("/api/v1/approvals/?mine=approver").json() == []
    refused = member.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert refused.status_code == 403 and "Only the approvers may decide" in refused.json()["message"]
    assert "role admin" in refused.json()["message"]
    assert Approval.all_tenants.get(pk=approval.pk).status == "pending"

    # Another tenant's admin sees nothing of it.
    outsider = other_world.client(admin=True)
    assert outsider.get("/api/v1/approvals/?mine=approver").json() == []
    assert outsider.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"},
                         format="json").status_code == 404
    assert member.get("/api/v1/approvals/?mine=everyone").status_code == 400

    # The admin's inbox: what a reviewer needs, across runs they cannot otherwise see.
    admin = world.client(admin=True)
    [item] = admin.get("/api/v1/approvals/?mine=approver").json()
    assert item["agent"]["name"] == "Payments" and item["requester"]["username"] == world.member.username
    assert (item["tool_name"], item["arguments"], item["can_decide"]) == ("test_echo", {"text": "ping"}, True)
    assert admin.get(f"/api/v1/runs/{run.pk}/").status_code == 404
    decided = admin.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve", "reason": "Budget ok."},
                         format="json")
    assert decided.status_code == 200, decided.content
    assert (decided.json()["status"], decided.json()["decided_by"]) == ("approved", world.admin.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "queued"

    # Audit log, trace and webhook: the decision, who made it and why.
    [event] = AuditEvent.all_tenants.filter(tenant=world.tenant, action="approval_decided")
    assert event.actor_id == world.admin.pk and event.detail["reason"] == "Budget ok."
    assert event.changes["status"]["to"] == "approved"
    [webhook] = WebhookDelivery.all_tenants.filter(event_type="approval.decided")
    assert (webhook.payload["data"]["decided_by"], webhook.payload["data"]["reason"]) == (world.admin.pk, "Budget ok.")
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    assert ToolCall.all_tenants.get(run_id=run.pk).status == "succeeded"
    trace = run_trace(run=Run.all_tenants.get(pk=run.pk), admin=True)
    [approval_seen] = [t["approval"] for turn in trace["turns"] for t in turn["tool_calls"] if t["approval"]]
    assert (approval_seen["decided_by"], approval_seen["answer"]) == (world.admin.username, "Budget ok.")
    assert approval_seen["approvers"]["roles"] == ["admin"] and not approval_seen["decided_on_timeout"]


def test_a_named_member_decides_and_others_do_not_see_it(world, fake_llm, no_enqueue):
    reviewer = get_user_model().objects.create_user(username="rita", email="Rita@Example.com", password="pw-rita-123")
    membership_create(tenant=world.tenant, user=reviewer, role=Role.MEMBER)
    rule = {"pattern": "*", "action": "ask", "approvers": {"requester": True, "members": ["rita@example.com"]}}
    run = _paused_run(world, fake_llm, [rule])
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    assert approval.approvers == {"requester": True, "roles": [], "user_ids": [reviewer.pk]}
    admin = world.client(admin=True)  # an admin, but not named: not theirs to see
    assert admin.get("/api/v1/approvals/?mine=approver").json() == []
    assert admin.get(f"/api/v1/approvals/{approval.pk}/").status_code == 404
    assert world.client().get("/api/v1/approvals/").json()[0]["can_decide"] is True  # requester: true

    from rest_framework.test import APIClient

    rita = APIClient()
    rita.force_authenticate(reviewer)
    [item] = rita.get("/api/v1/approvals/?mine=approver").json()
    assert item["id"] == approval.pk
    denied = rita.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "deny", "reason": "Not this one."},
                       format="json")
    assert denied.status_code == 200 and denied.json()["status"] == "denied"
    run_now(run.pk)
    call = ToolCall.all_tenants.get(run_id=run.pk)
    assert call.status == "failed" and "Not this one." in call.error


def test_the_timeout_decides_as_the_rule_says_and_no_worker_waits(world, fake_llm, no_enqueue):
    policy = [{"pattern": "test_echo", "action": "ask", "timeout_seconds": 3 * 86400, "on_timeout": "approve"},
              {"pattern": "test_sleep", "action": "ask", "timeout_seconds": 3 * 86400, "on_timeout": "deny"}]
    run = _paused_run(world, fake_llm, policy, calls=(("test_echo", {"text": "a"}), ("test_sleep", {"seconds": 0})),
                      bindings=("test_echo", "test_sleep"))
    assert runs_sweep()["approvals_expired"] == 0  # three days to go: nothing happens
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"
    Approval.all_tenants.filter(run_id=run.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    no_enqueue.clear()
    runs_sweep()  # the beat's sweeper, days later: each decided by its rule, the run resumes
    by_tool = {a.tool_name: a for a in Approval.all_tenants.filter(run_id=run.pk)}
    assert (by_tool["test_echo"].status, by_tool["test_sleep"].status) == ("approved", "expired")
    assert all(a.decided_on_timeout and a.decided_by_id is None for a in by_tool.values())
    assert Run.all_tenants.get(pk=run.pk).status == "queued" and no_enqueue == [run.pk]
    events = AuditEvent.all_tenants.filter(tenant=world.tenant, action="approval_decided")
    assert sorted(e.detail["by"] for e in events) == ["timeout", "timeout"] and {e.actor_id for e in events} == {None}
    late = world.client().post(f"/api/v1/approvals/{by_tool['test_echo'].pk}/", {"decision": "deny"}, format="json")
    assert late.status_code == 409 and "Nobody decided in time" in late.json()["message"]
    run_now(run.pk)
    calls = {c.name: c for c in ToolCall.all_tenants.filter(run_id=run.pk)}
    assert calls["test_echo"].status == "succeeded"
    assert calls["test_sleep"].status == "failed" and "Nobody approved" in calls["test_sleep"].error
    assert Run.all_tenants.get(pk=run.pk).status == "completed"


def test_the_console_lists_what_waits_and_decides_only_as_an_approver(world, other_world, fake_llm, no_enqueue):
    from django.test import Client

    policy = [{"pattern": "test_echo", "action": "ask", "approvers": {"roles": ["admin"]}},
              {"pattern": "test_sleep", "action": "ask", "approvers": {"roles": ["owner"]}}]
    run = _paused_run(world, fake_llm, policy, calls=(("test_echo", {"text": "a"}), ("test_sleep", {"seconds": 0})),
                      bindings=("test_echo", "test_sleep"))
    by_tool = {a.tool_name: a for a in Approval.all_tenants.filter(run_id=run.pk)}
    console = Client()
    console.force_login(world.admin)
    listed = console.get("/admin/agent_sessions/approval/").content.decode()
    assert "test_echo" in listed and "test_sleep" in listed and "role owner" in listed
    other = Client()
    other.force_login(other_world.admin)
    assert "test_echo" not in other.get("/admin/agent_sessions/approval/").content.decode()

    selected = {"action": "approve_selected", "_selected_action": [a.pk for a in by_tool.values()]}
    confirm = console.post("/admin/agent_sessions/approval/", selected)  # the page that asks for a reason
    assert confirm.status_code == 200 and 'name="reason"' in confirm.content.decode()
    assert Approval.all_tenants.filter(run_id=run.pk, status="pending").count() == 2  # nothing decided yet
    answer = console.post("/admin/agent_sessions/approval/", {**selected, "confirm": "yes", "reason": "Looks safe."},
                          follow=True)
    page = answer.content.decode()
    assert "1 approved." in page and "Only the approvers may decide this approval: role owner." in page
    echo, sleep = (Approval.all_tenants.get(pk=by_tool[name].pk) for name in ("test_echo", "test_sleep"))
    assert (echo.status, echo.decided_by_id, sleep.status) == ("approved", world.admin.pk, "pending")
    assert echo.answer == "Looks safe."  # the decision's reason (audit log, trace)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"  # the owner's decision still waits
