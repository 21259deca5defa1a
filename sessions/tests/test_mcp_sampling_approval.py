"""A person approves each MCP sampling request when the binding says ``sampling.require_approval``
(issue 37), through a run on the fake model and :mod:`capabilities.tests.prog_test_server`, in
both protocol eras: the run pauses (no worker holds it) with a pending Approval of kind
``sampling``; approved through the approvals API, the agent's model answers the server's request
(an LLM call of purpose ``sampling``) and the call goes on; denied (or not decided in time),
the model is not called for it, and the server hears the user declined (2025-11-25) or the call
fails with that reason (2026-07-28). Without ``require_approval`` nobody is asked."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from capabilities.mcp.pool import mcp_pool
from capabilities.tests.prog_test_server import serve_prog
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, LLMCall, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message
from sessions.tests.test_mcp_prog_run import _agent  # the agent with the prog server bound, config validated

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

ASK = {"sampling": {"allowed": True, "require_approval": True}}
DECLINED = "The user declined MCP server 'prog''s request to use the agent's model (sampling)."


@pytest.fixture
async def prog():
    with serve_prog() as served:
        yield served
        await mcp_pool().aclose()  # before the server stops: an open session would hold its shutdown


@pytest.fixture(params=["auto", "legacy"])
def era(request, monkeypatch):
    """``auto``: 2026-07-28 (the request rides an InputRequiredResult); ``legacy``: 2025-11-25
    (the request arrives inside the open call, which is held in the pool meanwhile)."""
    if request.param == "legacy":
        from capabilities import services

        config = services.mcp_server_config
        monkeypatch.setattr(services, "mcp_server_config",
                            lambda **kw: dataclasses.replace(config(**kw), protocol_mode="legacy"))
    return request.param




@database_sync_to_async
def _state(run_id):
    run = Run.all_tenants.get(pk=run_id)
    return (run, list(Approval.all_tenants.filter(run_id=run_id)), list(ToolCall.all_tenants.filter(run_id=run_id)),
            list(LLMCall.all_tenants.filter(run_id=run_id).order_by("id").values_list("purpose", flat=True)))


@database_sync_to_async
def _get(client, path):
    return client.get(path)


@database_sync_to_async
def _post(client, path, body):
    return client.post(path, body, format="json")


async def _paused(world, fake_llm, prog, *replies):
    url, state = prog
    agent = await _agent(world, fake_llm.base_url, url, ASK)
    fake_llm.script(ToolCalls([("prog__summarize", {"text": "a long text"})]), *replies)
    run = await post_message(agent=agent, user=world.member, content="Summarize it")
    await execute_run(run.pk)
    run, [approval], [call], purposes = await _state(run.pk)
    assert (run.status, call.status, approval.kind, approval.status) == (
        "awaiting_approval", "awaiting_approval", "sampling", "pending"), run.error
    assert run.heartbeat_at is None and purposes == ["turn"]  # no worker holds it, the model not asked
    assert len(state.samples) == 1
    return run, approval


async def test_an_approved_request_is_answered_by_the_agents_model(world, fake_llm, prog, era):
    run, approval = await _paused(world, fake_llm, prog, Reply("Short."), Reply("Here it is."))
    [item] = (await _get(world.client(), "/api/v1/approvals/")).json()
    assert (item["id"], item["kind"], item["server"], item["tool_call"], item["can_decide"]) == (
        approval.pk, "sampling", "prog", approval.tool_call_id, True)
    assert item["message"] == "The MCP server 'prog' asks to use the agent's model (sampling)."
    assert item["sampling"]["requests"] == [{
        "messages": [{"role": "user", "text": "Summarize: a long text"}],
        "system_prompt": "You write one-line summaries.", "max_tokens": 1024, "offers_tools": False, "tools": []}]
    assert "params" not in str(item) and "request_state" not in str(item)  # not the server's raw request

    resp = await _post(world.client(), f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"})
    assert resp.status_code == 200 and resp.json()["status"] == "approved", resp.content
    await execute_run(run.pk)
    run, _, [call], purposes = await _state(run.pk)
    assert (run.status, call.status, purposes) == ("completed", "succeeded", ["turn", "sampling", "turn"]), run.error
    assert "summary: Short." in call.result
    assert fake_llm.requests[1]["messages"][-1]["content"] == "Summarize: a long text"
    if era == "legacy":
        assert mcp_pool().sessions[0]._in_flight == 0  # the held call ended


async def test_a_denied_request_never_reaches_the_model(world, fake_llm, prog, era):
    run, approval = await _paused(world, fake_llm, prog, Reply("Could not summarize."))
    resp = await _post(world.client(), f"/api/v1/approvals/{approval.pk}/", {"decision": "deny", "reason": "private"})
    assert resp.status_code == 200 and resp.json()["status"] == "denied", resp.content
    await execute_run(run.pk)
    run, _, [call], purposes = await _state(run.pk)
    assert (run.status, purposes) == ("completed", ["turn", "turn"]), run.error
    said = f"{DECLINED} Their reason: private"
    if era == "legacy":  # the server heard an MCP error and went on
        assert call.status == "succeeded" and f"refused: {said}" in call.result
    else:  # 2026-07-28 cannot refuse one request: the call fails with the reason
        assert call.status == "failed" and said in call.error
    assert said in str(fake_llm.requests[1]["messages"][-1]["content"])  # the model reads it


async def test_nobody_deciding_in_time_is_a_denial(world, fake_llm, prog):
    from sessions.services import runs_sweep

    run, approval = await _paused(world, fake_llm, prog, Reply("Nobody answered."))
    await database_sync_to_async(Approval.all_tenants.filter(pk=approval.pk).update)(
        expires_at=timezone.now() - timedelta(seconds=1))
    await database_sync_to_async(runs_sweep)()
    assert (await _state(run.pk))[0].status == "queued"  # resumed, not failed
    await execute_run(run.pk)
    run, [approval], [call], purposes = await _state(run.pk)
    assert (run.status, approval.status, purposes) == ("completed", "expired", ["turn", "turn"]), run.error
    assert DECLINED in call.error


async def test_another_tenant_neither_sees_nor_decides_it(world, other_world, fake_llm, prog):
    run, approval = await _paused(world, fake_llm, prog)
    for client in (other_world.client(), other_world.client(admin=True)):
        assert (await _post(client, f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"})).status_code == 404
        assert (await _get(client, f"/api/v1/approvals/{approval.pk}/")).status_code == 404
        assert (await _get(client, "/api/v1/approvals/?mine=approver")).json() == []
    _, [approval], _, purposes = await _state(run.pk)
    assert (approval.status, purposes) == ("pending", ["turn"])


async def test_without_require_approval_nobody_is_asked(world, fake_llm, prog, era):
    url, _ = prog
    agent = await _agent(world, fake_llm.base_url, url, {"sampling": {"allowed": True, "require_approval": False}})
    fake_llm.script(ToolCalls([("prog__summarize", {"text": "t"})]), Reply("Short."), Reply("Done."))
    run = await post_message(agent=agent, user=world.member, content="Summarize it")
    await execute_run(run.pk)
    run, approvals, [call], purposes = await _state(run.pk)
    assert (run.status, approvals, purposes) == ("completed", [], ["turn", "sampling", "turn"]), run.error
    assert "summary: Short." in call.result
