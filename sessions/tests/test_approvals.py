"""Human in the loop: approval policies per binding, tools that ask for approval themselves,
``ask_user``, the approvals API, expiry, and runs that pause without holding a worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.services import runs_sweep
from sessions.tests import tools_for_tests
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)


def _agent(world, fake_llm, *bindings):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    for name, policy in bindings:
        bind_builtin(agent, name, approval_policy=policy)
    return agent


def _run(pk) -> Run:
    return Run.all_tenants.get(pk=pk)


def _approvals(run_id) -> list[Approval]:
    return list(Approval.all_tenants.filter(run_id=run_id).order_by("id"))


def _events(run_id, event_type):
    from sessions.events import events_since_sync

    run = _run(run_id)
    return [e for e in events_since_sync(session_id=run.session_id, after_seq=0)
            if e["type"] == event_type and e["run_id"] == run_id]


def test_ask_policy_pauses_the_run_then_approval_resumes_it(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "test_*", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("The echo said ping."))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    no_enqueue.clear()
    run_now(run.pk)

    run = _run(run.pk)
    assert run.status == "awaiting_approval" and run.paused_at is not None and run.heartbeat_at is None
    [approval] = _approvals(run.pk)
    assert (approval.status, approval.tool_name, approval.arguments) == ("pending", "test_echo", {"text": "ping"})
    assert ToolCall.all_tenants.get(run=run).status == "awaiting_approval"
    [event] = _events(run.pk, "run_awaiting_approval")
    assert event["data"]["approvals"][0]["approval_id"] == approval.pk
    assert event["data"]["approvals"][0]["arguments"] == {"text": "ping"}
    assert len(fake_llm.requests) == 1 and no_enqueue == []  # nothing holds the run

    client = world.client()
    listed = client.get("/api/v1/approvals/").json()
    assert [a["id"] for a in listed] == [approval.pk]
    resp = client.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "approved"
    assert _run(run.pk).status == "queued" and no_enqueue == [run.pk]
    again = client.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "deny"}, format="json")
    assert again.status_code == 409 and "already approved" in again.json()["message"]

    run_now(run.pk)  # any worker: the run resumes from the database
    run = _run(run.pk)
    assert (run.status, run.reply) == ("completed", "The echo said ping.")
    call = ToolCall.all_tenants.get(run=run)
    assert (call.status, call.result) == ("succeeded", "echo: ping")
    assert fake_llm.requests[1]["messages"][-1]["content"] == "echo: ping"
    assert _events(run.pk, "approval_resolved")[0]["data"]["status"] == "approved"


def test_deny_feeds_the_reason_back_to_the_model(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "test_echo", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("Understood, I will not echo."))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = _approvals(run.pk)
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/",
                               {"decision": "deny", "reason": "not today"}, format="json")
    assert resp.status_code == 200 and resp.json()["status"] == "denied"
    run_now(run.pk)
    run = _run(run.pk)
    assert run.status == "completed"
    call = ToolCall.all_tenants.get(run=run)
    assert call.status == "failed" and "not today" in call.error
    tool_message = fake_llm.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "denied" in tool_message["content"] and "not today" in tool_message["content"]


def test_two_parallel_calls_each_get_their_own_approval(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "*", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "a"}), ("test_echo", {"text": "b"})]), Reply("both done"))
    run = post_message_sync(agent=agent, user=world.member, content="two")
    run_now(run.pk)
    by_text = {a.arguments["text"]: a for a in _approvals(run.pk)}  # created in parallel: any id order
    first, second = by_text["a"], by_text["b"]
    client = world.client()
    assert client.post(f"/api/v1/approvals/{first.pk}/", {"decision": "approve"}, format="json").status_code == 200
    assert _run(run.pk).status == "awaiting_approval"  # one is still pending
    no_enqueue.clear()
    assert client.post(f"/api/v1/approvals/{second.pk}/", {"decision": "deny"}, format="json").status_code == 200
    assert no_enqueue == [run.pk]
    run_now(run.pk)
    assert _run(run.pk).status == "completed"
    calls = {c.arguments["text"]: c for c in ToolCall.all_tenants.filter(run_id=run.pk)}
    assert (calls["a"].status, calls["b"].status) == ("succeeded", "failed")
    assert [m["role"] for m in fake_llm.requests[1]["messages"][-3:]] == ["assistant", "tool", "tool"]


def test_expired_approval_fails_the_run(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "*", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = _approvals(run.pk)
    Approval.all_tenants.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert runs_sweep()["approvals_expired"] == 1
    run = _run(run.pk)
    assert (run.status, run.reason) == ("failed", "approval_expired")
    assert Approval.all_tenants.get(pk=approval.pk).status == "expired"
    assert ToolCall.all_tenants.get(run=run).status == "cancelled"
    assert _events(run.pk, "run_failed")[0]["data"]["reason"] == "approval_expired"
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 409


def test_deciding_an_expired_approval_is_refused_and_fails_the_run(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "*", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = _approvals(run.pk)
    Approval.all_tenants.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 409 and "expired" in resp.json()["message"]
    assert (_run(run.pk).status, _run(run.pk).reason) == ("failed", "approval_expired")


def test_deny_policy_fails_the_call_without_running_it(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_guarded", [{"pattern": "test_guarded", "action": "deny"}]))
    tools_for_tests.GuardedTool.executions.clear()
    fake_llm.script(ToolCalls([("test_guarded", {"text": "x"})]), Reply("ok, not allowed"))
    run = post_message_sync(agent=agent, user=world.member, content="go")
    run_now(run.pk)
    assert _run(run.pk).status == "completed" and _approvals(run.pk) == []
    call = ToolCall.all_tenants.get(run_id=run.pk)
    assert call.status == "failed" and "does not allow" in call.error
    assert tools_for_tests.GuardedTool.executions == []


def test_a_tool_may_ask_for_approval_itself(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_guarded", []))
    tools_for_tests.GuardedTool.executions.clear()
    fake_llm.script(ToolCalls([("test_guarded", {"text": "secret"})]), Reply("done"))
    run = post_message_sync(agent=agent, user=world.member, content="go")
    run_now(run.pk)
    [approval] = _approvals(run.pk)
    assert approval.reason == "Sensitive action with 'secret'" and tools_for_tests.GuardedTool.executions == []
    world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    run_now(run.pk)
    assert _run(run.pk).status == "completed"
    assert tools_for_tests.GuardedTool.executions == ["secret"]  # once, with approval


def test_ask_user_pauses_until_the_answer_which_becomes_the_result(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("ask_user", []))
    fake_llm.script(ToolCalls([("ask_user", {"question": "Which city?"})]), Reply("Tokyo it is."))
    run = post_message_sync(agent=agent, user=world.member, content="Weather please")
    run_now(run.pk)
    [question] = _approvals(run.pk)
    assert (question.kind, question.question, _run(run.pk).status) == ("question", "Which city?", "awaiting_approval")
    client = world.client()
    bad = client.post(f"/api/v1/approvals/{question.pk}/", {"decision": "approve"}, format="json")
    assert bad.status_code == 400 and "answer" in bad.json()["message"]
    assert client.post(f"/api/v1/approvals/{question.pk}/", {"answer": "Tokyo"}, format="json").status_code == 200
    run_now(run.pk)
    assert _run(run.pk).reply == "Tokyo it is."
    assert fake_llm.requests[1]["messages"][-1]["content"] == "The user answered: Tokyo"


def test_approvals_are_private_to_the_runs_user(world, other_world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "*", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = _approvals(run.pk)
    for client in (other_world.client(), world.client(admin=True)):
        assert client.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json").status_code == 404
        assert client.get(f"/api/v1/approvals/{approval.pk}/").status_code == 404
        assert client.get("/api/v1/approvals/").json() == []
    assert Approval.all_tenants.get(pk=approval.pk).status == "pending"


def test_cancelling_a_run_awaiting_approval_ends_it_at_once(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, ("test_echo", [{"pattern": "*", "action": "ask"}]))
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    resp = world.client().post(f"/api/v1/runs/{run.pk}/cancel/")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert _approvals(run.pk)[0].status == "expired"
    assert _events(run.pk, "run_cancelled")


def test_invalid_approval_policy_is_rejected_by_the_admin_api(world):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
    resp = world.client(admin=True).post("/api/v1/admin/bindings/", {
        "agent": agent.pk, "kind": "builtin", "builtin_name": "test_echo",
        "approval_policy": [{"pattern": "*", "action": "maybe"}],
    }, format="json")
    assert resp.status_code == 400, resp.content
    assert "approval_policy" in str(resp.json())
