"""A deleted chat's runs are gone from the API for their owner too (README, "Using the chat
app": deleted chats "are hidden from the chat app and from every API (404 for the chat, its
runs, artifacts, approvals and documents)" until Undo): the run trace, the run, its
activities, its cancel, edit and retry, its artifacts and its approvals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Artifact, ChatSession, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)


@pytest.fixture
def finished_run(world, fake_llm, no_enqueue) -> Run:
    """The member's completed run: test_echo asked for approval, approved through the API, then
    the answer; with an artifact of the run's tool call."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Echoer")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("The echo said ping."))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    decided = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert decided.status_code == 200, decided.content
    run_now(run.pk)
    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", (run.reason, run.error)
    call = ToolCall.all_tenants.get(run=run)
    Artifact.all_tenants.create(tenant=world.tenant, session=run.session, run=run, tool_call=call, name="echo.txt",
                                mime_type="text/plain", size_bytes=4, content=b"ping")
    return run


def _reads(run: Run) -> dict[str, str]:
    """The GET endpoints that show ``run`` or its session's run-level data to its owner."""
    artifact = Artifact.all_tenants.get(run=run)
    approval = Approval.all_tenants.get(run=run)
    return {
        "trace": f"/api/v1/runs/{run.pk}/trace/",
        "run": f"/api/v1/runs/{run.pk}/",
        "activities": f"/api/v1/runs/{run.pk}/activities/",
        "session": f"/api/v1/sessions/{run.session_id}/",
        "artifacts": f"/api/v1/sessions/{run.session_id}/artifacts/",
        "artifact": f"/api/v1/artifacts/{artifact.pk}/",
        "artifact content": f"/api/v1/artifacts/{artifact.pk}/content",
        "approval": f"/api/v1/approvals/{approval.pk}/",
        "knowledge uploads": f"/api/v1/sessions/{run.session_id}/knowledge-uploads/",
    }


def test_a_deleted_chats_run_trace_and_other_run_endpoints_answer_404_to_its_owner(world, finished_run):
    client = world.client()
    reads = _reads(finished_run)
    before = {name: client.get(url).status_code for name, url in reads.items()}
    assert before == dict.fromkeys(reads, 200)
    assert client.get(reads["trace"]).json()["run"]["reply"] == "The echo said ping."

    assert client.delete(f"/api/v1/sessions/{finished_run.session_id}/").status_code == 204
    assert ChatSession.all_tenants.get(pk=finished_run.session_id).deleted_at is not None
    after = {name: (r.status_code, r.json().get("message")) for name, url in reads.items()
             if (r := client.get(url))}
    assert after == {
        "trace": (404, "Run not found."), "run": (404, "Run not found."), "activities": (404, "Run not found."),
        "session": (404, "Session not found."), "artifacts": (404, "Session not found."),
        "artifact": (404, "Artifact not found."), "artifact content": (404, "Artifact not found."),
        "approval": (404, "Approval not found."), "knowledge uploads": (404, "Session not found."),
    }, after
    # the run's writes as well (not 409 "already finished" or 201: whether it exists is not told)
    run_id = finished_run.pk
    assert client.post(f"/api/v1/runs/{run_id}/cancel/").status_code == 404
    assert client.post(f"/api/v1/runs/{run_id}/retry/").status_code == 404
    assert client.post(f"/api/v1/runs/{run_id}/edit/", {"content": "Echo pong"}, format="json").status_code == 404
    approval = Approval.all_tenants.get(run_id=run_id)
    assert client.post(f"/api/v1/approvals/{approval.pk}/", {"decision": "deny"}, format="json").status_code == 404

    # Undo: the same endpoints answer again (the 404s came from the deletion alone)
    assert client.post(f"/api/v1/sessions/{finished_run.session_id}/restore/").status_code == 200
    assert {name: client.get(url).status_code for name, url in reads.items()} == dict.fromkeys(reads, 200)


def test_a_deleted_chats_pending_approval_leaves_the_owners_approval_list(world, fake_llm, no_enqueue):
    """A pending approval of a chat marked deleted (``deleted_at`` set while the approval was
    still pending: the list must not depend on the deletion having expired it) is neither
    listed nor readable."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = Approval.all_tenants.filter(run_id=run.pk, status="pending")
    client = world.client()
    assert [a["id"] for a in client.get("/api/v1/approvals/").json()] == [approval.pk]

    ChatSession.all_tenants.filter(pk=run.session_id).update(deleted_at=timezone.now() - timedelta(seconds=1))
    assert Approval.all_tenants.get(pk=approval.pk).status == "pending"
    assert client.get("/api/v1/approvals/").json() == []
    assert client.get(f"/api/v1/approvals/{approval.pk}/").status_code == 404


def test_deleting_a_chat_through_the_api_expires_its_pending_approval(world, fake_llm, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Asker")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo ping")
    run_now(run.pk)
    [approval] = Approval.all_tenants.filter(run_id=run.pk, status="pending")
    client = world.client()
    assert client.delete(f"/api/v1/sessions/{run.session_id}/").status_code == 204
    assert Run.all_tenants.get(pk=run.pk).status == "cancelled"
    assert Approval.all_tenants.get(pk=approval.pk).status != "pending"
    assert client.get("/api/v1/approvals/").json() == []
    assert client.get(f"/api/v1/runs/{run.pk}/trace/").status_code == 404
