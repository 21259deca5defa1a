"""Approvals and questions inside a skill's sub-run: the whole run tree pauses with no worker
holding it, the Approval belongs to the user's run, and the decision resumes the same sub-run
on any worker (approve, deny, answer, expiry, cancelling either run, nested skills, and a
restart of every worker)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from llm.testing import Reply, ToolCalls
from sessions.events import events_since_sync
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.services import runs_sweep
from sessions.tests import tools_for_tests
from sessions.tests.conftest import post_message_sync
from sessions.tests.test_durability import approve_across_a_restart, workers  # noqa: F401 (fixture)
from sessions.tests.test_subruns import _cancel, make_agent_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)

ASK_ECHO = ("test_echo", {"approval_policy": [{"pattern": "test_echo", "action": "ask"}]})


def _run(pk) -> Run:
    return Run.all_tenants.get(pk=pk)


def _sub_runs(run_id) -> list[Run]:
    return list(Run.all_tenants.filter(parent_tool_call__run_id=run_id).order_by("id"))


def _calls(run_id) -> list[ToolCall]:
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


def _events(session_id, run_id, event_type):
    return [e for e in events_since_sync(session_id=session_id, after_seq=0)
            if e["type"] == event_type and e["run_id"] == run_id]


def _paused_in_skill(world, fake_llm, no_enqueue, *, sub_calls, builtins=(ASK_ECHO,), allowed=("test_echo",)):
    """A user's run whose skill ``careful`` made ``sub_calls`` in one turn and now waits."""
    agent = make_agent_sync(world, fake_llm.base_url, builtins=builtins, skills=[("careful", list(allowed), {})])
    fake_llm.script(ToolCalls([("careful", {"task": "do it"})]), ToolCalls(sub_calls))
    run = post_message_sync(agent=agent, user=world.member, content="go")
    no_enqueue.clear()
    run_now(run.pk)
    [sub] = _sub_runs(run.pk)
    return _run(run.pk), sub


def test_approvals_and_a_question_inside_a_skill_pause_the_user_run_and_resume_the_same_sub_run(
    world, fake_llm, no_enqueue,
):
    tools_for_tests.GuardedTool.executions.clear()
    run, sub = _paused_in_skill(
        world, fake_llm, no_enqueue,
        builtins=(ASK_ECHO, "test_guarded", "ask_user"), allowed=("test_echo", "test_guarded", "ask_user"),
        sub_calls=[("test_echo", {"text": "x"}), ("test_guarded", {"text": "secret"}),
                   ("ask_user", {"question": "Which colour?"})],
    )
    # The tree waits, and nothing holds it: the user's run, the sub-run and the skill call.
    assert run.status == "awaiting_approval" and run.heartbeat_at is None and no_enqueue == []
    assert (sub.status, sub.attempt) == ("awaiting_approval", 1)
    [skill_call] = _calls(run.pk)
    assert skill_call.status == "awaiting_approval" and skill_call.finished_at is None
    assert [c.status for c in _calls(sub.pk)] == ["awaiting_approval"] * 3
    # Created in parallel: in call order, not id order.
    echo, guarded, question = Approval.all_tenants.filter(run_id=run.pk).order_by("tool_call_id")
    assert all(a.sub_run_id == sub.pk for a in (echo, guarded, question))
    assert [(a.kind, a.tool_name) for a in (echo, guarded, question)] == [
        ("tool_call", "test_echo"), ("tool_call", "test_guarded"), ("question", "ask_user")]
    assert guarded.reason == "Sensitive action with 'secret'" and question.question == "Which colour?"
    assert tools_for_tests.GuardedTool.executions == [] and len(fake_llm.requests) == 2

    # Events: the user's run lists every approval (with the skill); the sub-run has its own.
    [paused] = _events(run.session_id, run.pk, "run_awaiting_approval")
    assert sorted((a["tool_call_id"], a["approval_id"], a["sub_run_id"], a["skill"]) for a in paused["data"]["approvals"]) == [
        (a.tool_call_id, a.pk, sub.pk, "careful") for a in (echo, guarded, question)]
    [sub_paused] = _events(run.session_id, sub.pk, "run_awaiting_approval")
    assert sub_paused["data"]["parent_run_id"] == run.pk and len(sub_paused["data"]["approvals"]) == 3

    client = world.client()
    listed = client.get("/api/v1/approvals/").json()
    assert sorted((a["tool_call"], a["id"], a["run"], a["sub_run"], a["skill"]) for a in listed) == [
        (a.tool_call_id, a.pk, run.pk, sub.pk, "careful") for a in (echo, guarded, question)]
    assert client.post(f"/api/v1/approvals/{echo.pk}/", {"decision": "approve"}, format="json").status_code == 200
    assert client.post(f"/api/v1/approvals/{guarded.pk}/", {"decision": "approve"}, format="json").status_code == 200
    assert _run(run.pk).status == "awaiting_approval" and no_enqueue == []  # the question is still open
    resp = client.post(f"/api/v1/approvals/{question.pk}/", {"answer": "Blue"}, format="json")
    assert resp.status_code == 200, resp.content
    assert _run(run.pk).status == "queued" and no_enqueue == [run.pk]
    [resolved] = [e for e in _events(run.session_id, run.pk, "approval_resolved")
                  if e["data"]["approval_id"] == question.pk]
    assert resolved["data"] == {"approval_id": question.pk, "tool_call_id": question.tool_call_id,
                                "status": "answered", "sub_run_id": sub.pk}

    fake_llm.script(Reply("Echoed, did it, blue."), Reply("The skill is done."))
    run_now(run.pk)  # any worker: the user's run re-executes the skill call, which resumes the sub-run
    run = _run(run.pk)
    assert (run.status, run.reply) == ("completed", "The skill is done.")
    assert _sub_runs(run.pk) == [sub]
    sub = _run(sub.pk)
    assert (sub.status, sub.attempt, sub.reply) == ("completed", 2, "Echoed, did it, blue.")
    assert [(c.status, c.result) for c in _calls(sub.pk)] == [
        ("succeeded", "echo: x"), ("succeeded", "did secret"), ("succeeded", "The user answered: Blue")]
    assert tools_for_tests.GuardedTool.executions == ["secret"]  # executed once, after the approval
    [skill_call] = _calls(run.pk)
    assert (skill_call.status, skill_call.result) == ("succeeded", "Echoed, did it, blue.")
    # The sub-run's model read the three results; the user's model read the skill's answer.
    assert [m.get("content") for m in fake_llm.requests[2]["messages"][-3:]] == [
        "echo: x", "did secret", "The user answered: Blue"]
    assert fake_llm.requests[3]["messages"][-1]["content"] == "Echoed, did it, blue."
    assert len(fake_llm.requests) == 4

    # The session as the chat app loads it: the approvals are on the user's run, with the skill.
    detail = client.get(f"/api/v1/sessions/{run.session_id}/").json()
    [shown] = [r for r in detail["runs"] if r["id"] == run.pk]
    assert sorted((a["tool_call"], a["status"], a["skill"]) for a in shown["approvals"]) == [
        (echo.tool_call_id, "approved", "careful"), (guarded.tool_call_id, "approved", "careful"),
        (question.tool_call_id, "answered", "careful")]


def test_a_denial_inside_a_skill_is_fed_back_to_the_skills_model(world, fake_llm, no_enqueue):
    run, sub = _paused_in_skill(world, fake_llm, no_enqueue, sub_calls=[("test_echo", {"text": "x"})])
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "deny", "reason": "Not today."},
                               format="json")
    assert resp.status_code == 200 and no_enqueue == [run.pk]
    fake_llm.script(Reply("I was not allowed to echo."), Reply("The skill could not echo."))
    run_now(run.pk)
    assert _run(run.pk).status == "completed"
    [echo] = _calls(sub.pk)
    assert echo.status == "failed" and echo.result == ""
    assert fake_llm.requests[2]["messages"][-1]["content"] == (
        "Error: The user denied this tool call. Their reason: Not today. Do not retry it unchanged.")
    assert _run(sub.pk).reply == "I was not allowed to echo."


def test_an_expired_approval_inside_a_skill_fails_the_user_run_and_ends_the_sub_run(world, fake_llm, no_enqueue):
    run, sub = _paused_in_skill(world, fake_llm, no_enqueue, sub_calls=[("test_echo", {"text": "x"})])
    Approval.all_tenants.filter(run_id=run.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert runs_sweep()["approvals_expired"] == 1
    run = _run(run.pk)
    assert (run.status, run.reason) == ("failed", "approval_expired")
    assert _run(sub.pk).status == "cancelled"
    assert Approval.all_tenants.get(run_id=run.pk).status == "expired"
    assert [c.status for c in _calls(run.pk)] == ["cancelled"] and [c.status for c in _calls(sub.pk)] == ["cancelled"]
    assert len(fake_llm.requests) == 2 and no_enqueue == []


def test_cancelling_the_waiting_sub_run_resumes_the_user_run_with_the_skill_cancelled(world, fake_llm, no_enqueue):
    run, sub = _paused_in_skill(world, fake_llm, no_enqueue, sub_calls=[("test_echo", {"text": "x"})])
    resp = world.client().post(f"/api/v1/runs/{sub.pk}/cancel/")
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "cancelled"
    assert Approval.all_tenants.get(run_id=run.pk).status == "expired"
    assert _run(run.pk).status == "queued" and no_enqueue == [run.pk]
    [cancelled] = _events(run.session_id, sub.pk, "run_cancelled")
    assert cancelled["data"]["parent_run_id"] == run.pk

    fake_llm.script(Reply("The skill was cancelled."))
    run_now(run.pk)
    run = _run(run.pk)
    assert (run.status, run.reply) == ("completed", "The skill was cancelled.")
    [skill_call] = _calls(run.pk)
    assert skill_call.status == "failed" and skill_call.error == "The skill 'careful' did not finish: Cancelled by the user."
    assert len(fake_llm.requests) == 3


def test_cancelling_the_user_run_while_its_skill_waits_ends_both(world, fake_llm, no_enqueue):
    run, sub = _paused_in_skill(world, fake_llm, no_enqueue, sub_calls=[("test_echo", {"text": "x"})])
    _cancel(run.pk)
    assert _run(run.pk).status == "cancelled" and _run(sub.pk).status == "cancelled"
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    assert approval.status == "expired"
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 409
    assert no_enqueue == []


def _paused_two_skills_deep(world, fake_llm, no_enqueue):
    """A user's run whose skill ``outer`` called skill ``inner``, whose echo now waits."""
    agent = make_agent_sync(world, fake_llm.base_url, builtins=[ASK_ECHO],
                            skills=[("outer", ["inner", "test_echo"], {}), ("inner", ["test_echo"], {})])
    fake_llm.script(ToolCalls([("outer", {"task": "a"})]), ToolCalls([("inner", {"task": "b"})]),
                    ToolCalls([("test_echo", {"text": "deep"})]))
    run = post_message_sync(agent=agent, user=world.member, content="go")
    no_enqueue.clear()
    run_now(run.pk)
    [outer] = _sub_runs(run.pk)
    [inner] = _sub_runs(outer.pk)
    return run, outer, inner


def test_an_approval_two_skills_deep_pauses_and_resumes_every_level(world, fake_llm, no_enqueue):
    run, outer, inner = _paused_two_skills_deep(world, fake_llm, no_enqueue)
    assert [_run(r).status for r in (run.pk, outer.pk, inner.pk)] == ["awaiting_approval"] * 3
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    assert approval.sub_run_id == inner.pk
    [paused] = _events(run.session_id, run.pk, "run_awaiting_approval")
    assert paused["data"]["approvals"][0]["skill"] == "inner"

    world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    fake_llm.script(Reply("inner done"), Reply("outer done"), Reply("all done"))
    run_now(run.pk)
    assert (_run(run.pk).status, _run(run.pk).reply) == ("completed", "all done")
    assert [(r.status, r.attempt) for r in (_run(outer.pk), _run(inner.pk))] == [("completed", 2), ("completed", 2)]
    assert [(c.status, c.result) for c in _calls(inner.pk)] == [("succeeded", "echo: deep")]
    assert len(fake_llm.requests) == 6


def test_cancelling_a_waiting_skill_expires_the_approvals_of_the_skills_below_it(world, fake_llm, no_enqueue):
    run, outer, inner = _paused_two_skills_deep(world, fake_llm, no_enqueue)
    _cancel(outer.pk)
    assert (_run(outer.pk).status, _run(inner.pk).status) == ("cancelled", "cancelled")
    assert Approval.all_tenants.get(run_id=run.pk).status == "expired"
    assert _run(run.pk).status == "queued" and no_enqueue == [run.pk]


def test_an_approval_inside_a_skill_survives_a_restart_of_every_worker(world, fake_llm, workers):  # noqa: F811
    agent = make_agent_sync(world, fake_llm.base_url, builtins=[ASK_ECHO], skills=[("careful", ["test_echo"], {})])
    fake_llm.script(ToolCalls([("careful", {"task": "t"})]), ToolCalls([("test_echo", {"text": "ping"})]),
                    Reply("echoed ping"), Reply("The skill echoed ping."))
    run = approve_across_a_restart(world, workers, agent, content="go")  # nothing of the tree stays in memory
    assert run.reply == "The skill echoed ping." and run.attempt == 2
    [sub] = _sub_runs(run.pk)
    assert (sub.status, sub.attempt) == ("completed", 2)
    assert [(c.status, c.result) for c in _calls(sub.pk)] == [("succeeded", "echo: ping")]
