"""MCP elicitation through a run (issue 37): an MCP server (the SDK's MCPServer, a tool whose
parameter is elicited with ``Resolve(Elicit[...])``) over Streamable HTTP on 2026-07-28 asks the
user during a tool call; the run pauses (no worker holds it), the approvals API shows and takes
the answer (checked against the requested schema), and the call is made again with it.
Also: decline, cancel, expiry (a decline), and runs nobody watches (the configured answer)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.services import mcp_server_save
from capabilities.tests.elicit_test_server import SIGN_IN_URL, serve_travel
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.runs.transitions import unattended_runs
from sessions.tests.conftest import post_message, post_message_sync

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(scope="module")
def travel_server_url() -> Iterator[str]:
    with serve_travel() as url:
        yield url


@pytest.fixture
async def travel_url(travel_server_url):
    """The server's URL; the test's MCP pool is closed before the server stops (a session
    still open would hold the server's graceful shutdown)."""
    yield travel_server_url
    await mcp_pool().aclose()


@database_sync_to_async
def _agent(world, llm_url, server_url, config=None):
    agent = agent_with_route(tenant=world.tenant, base_urls=[llm_url])
    server = mcp_server_save(tenant=world.tenant, env=None, name="travel", alias="travel",
                             transport="streamable_http", url=server_url)
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                         mcp_server=server, config=config or {})
    return agent


@database_sync_to_async
def _get(world, path):
    return world.client().get(path)


@database_sync_to_async
def _post(world, path, body):
    return world.client().post(path, body, format="json")


@database_sync_to_async
def _state(run_id):
    run = Run.all_tenants.get(pk=run_id)
    return run, list(Approval.all_tenants.filter(run_id=run_id)), list(ToolCall.all_tenants.filter(run_id=run_id))


async def _paused_run(world, fake_llm, travel_url, reply="Done.", tool="travel__book"):
    agent = await _agent(world, fake_llm.base_url, travel_url)
    fake_llm.script(ToolCalls([(tool, {})]), Reply(reply))
    run = await post_message(agent=agent, user=world.member, content="Book me a trip")
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, call.status) == ("awaiting_approval", "awaiting_approval"), run.error
    assert run.heartbeat_at is None  # no worker holds the run...
    assert [s.state for s in mcp_pool().sessions] == ["ready"] and mcp_pool().sessions[0]._in_flight == 0  # ...nor a call
    return run, approval


async def test_accept_validates_the_form_and_resumes_the_call_with_the_answer(world, fake_llm, travel_url):
    """``plan`` asks twice: each answer resumes the run, the call is made again with it, and the
    server's next question pauses the run again on the same approval."""
    run, approval = await _paused_run(world, fake_llm, travel_url, reply="Planned.", tool="travel__plan")
    listed = (await _get(world, "/api/v1/approvals/")).json()
    [item] = [a for a in listed if a["id"] == approval.pk]
    assert (item["kind"], item["mode"], item["message"], item["server"], item["tool_call"]) == (
        "elicitation", "form", "Where to, and for how long?", "travel", approval.tool_call_id)
    assert item["schema"]["required"] == ["city"] and item["schema"]["properties"]["days"]["type"] == "integer"

    bad = await _post(world, f"/api/v1/approvals/{approval.pk}/", {"action": "accept", "content": {"days": "two"}})
    assert bad.status_code == 400
    assert "city: required" in bad.json()["message"] and "days: must be an integer" in bad.json()["message"]
    ok = await _post(world, f"/api/v1/approvals/{approval.pk}/",
                     {"action": "accept", "content": {"city": "Oslo", "days": 2}})
    assert ok.status_code == 200, ok.content
    assert (await _state(run.pk))[0].status == "queued"

    await execute_run(run.pk)  # any worker: the retried call carries the answer and the server's state
    run, [again], _ = await _state(run.pk)
    assert (run.status, again.pk, again.status) == ("awaiting_approval", approval.pk, "pending")
    item = (await _get(world, f"/api/v1/approvals/{approval.pk}/")).json()
    assert (item["message"], item["schema"]["properties"]["nights"]["minimum"]) == ("How many nights at the hotel?", 1)
    bad = await _post(world, f"/api/v1/approvals/{approval.pk}/", {"action": "accept", "content": {"nights": 0}})
    assert bad.status_code == 400 and "nights: at least 1" in bad.json()["message"]
    assert (await _post(world, f"/api/v1/approvals/{approval.pk}/",
                        {"action": "accept", "content": {"nights": 3}})).status_code == 200

    await execute_run(run.pk)
    run, _, [call] = await _state(run.pk)
    assert (run.status, call.status) == ("completed", "succeeded"), run.error
    assert "Oslo, 2 days, 3 nights" in call.result


async def test_a_call_approved_once_is_not_asked_again_after_its_server_asked_the_person(world, fake_llm,
                                                                                         travel_url):
    """A tool whose binding says ``ask``: approved, it runs; its server elicits; answered, the
    call runs again as the same approved call (it used to ask for the tool's approval again and
    wait on an approval nobody could decide)."""
    agent = await _agent(world, fake_llm.base_url, travel_url)
    await database_sync_to_async(CapabilityBinding.all_tenants.filter(agent=agent).update)(
        approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("travel__book", {})]), Reply("Booked."))
    run = await post_message(agent=agent, user=world.member, content="Book me a trip")
    await execute_run(run.pk)
    run, [approval], _ = await _state(run.pk)
    assert (run.status, approval.kind) == ("awaiting_approval", "tool_call")
    assert (await _post(world, f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"})).status_code == 200

    await execute_run(run.pk)  # the approved call runs; its server asks the person
    run, [approval], _ = await _state(run.pk)
    assert (run.status, approval.kind, approval.status) == ("awaiting_approval", "elicitation", "pending")
    assert (await _post(world, f"/api/v1/approvals/{approval.pk}/", {"action": "decline"})).status_code == 200

    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, call.status) == ("completed", "succeeded"), (run.status, approval.kind, approval.status)
    assert "not booked: decline" in call.result


@pytest.mark.parametrize("action", ["decline"])  # cancel goes the same way
async def test_decline_and_cancel_reach_the_server(world, fake_llm, travel_url, action):
    run, approval = await _paused_run(world, fake_llm, travel_url)
    resp = await _post(world, f"/api/v1/approvals/{approval.pk}/", {"action": action})
    assert resp.status_code == 200, resp.content
    await execute_run(run.pk)
    run, _, [call] = await _state(run.pk)
    assert run.status == "completed" and f"not booked: {action}" in call.result


async def test_no_answer_in_time_is_a_decline(world, fake_llm, travel_url):
    from sessions.services import runs_sweep

    run, approval = await _paused_run(world, fake_llm, travel_url)
    await database_sync_to_async(Approval.all_tenants.filter(pk=approval.pk).update)(
        expires_at=timezone.now() - timedelta(seconds=1))
    await database_sync_to_async(runs_sweep)()
    assert (await _state(run.pk))[0].status == "queued"  # resumed, not failed
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert run.status == "completed" and "not booked: decline" in call.result
    assert approval.status == "expired"


async def test_the_bindings_elicitation_timeout_sets_the_expiry_and_its_end_is_a_decline(world, fake_llm,
                                                                                          travel_url):
    """``elicitation_timeout_seconds: 120`` on the binding: the approval expires 120 s after it
    was asked (not after ``APPROVAL_TTL_SECONDS``); the sweeper's expiry then declines it."""
    from django.db import transaction

    from sessions.runs import approvals_expire
    from tenants.scoping import tenant_scope

    @database_sync_to_async
    def sweep(now):  # what the sweeper does at ``now``
        with tenant_scope(world.tenant.pk), transaction.atomic():
            approvals_expire(now=now)

    agent = await _agent(world, fake_llm.base_url, travel_url, config={"elicitation_timeout_seconds": 120})
    fake_llm.script(ToolCalls([("travel__book", {})]), Reply("Done."))
    asked = timezone.now()
    run = await post_message(agent=agent, user=world.member, content="Book me a trip")
    await execute_run(run.pk)
    run, [approval], _ = await _state(run.pk)
    assert run.status == "awaiting_approval", run.error
    assert timedelta(seconds=119) <= approval.expires_at - asked <= timedelta(seconds=125)
    await sweep(asked + timedelta(seconds=60))
    assert (await _state(run.pk))[0].status == "awaiting_approval"
    await sweep(approval.expires_at + timedelta(seconds=1))
    assert (await _state(run.pk))[0].status == "queued"  # declined, resumed
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, approval.status) == ("completed", "expired") and "not booked: decline" in call.result


@pytest.mark.parametrize("timeout", [0, -5, 1.5, "600", True, 7 * 24 * 3600 + 1])
def test_the_admin_api_refuses_a_bad_elicitation_timeout(world, timeout):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
    server = mcp_server_save(tenant=world.tenant, env=None, name="travel", alias="travel",
                             transport="streamable_http", url="http://127.0.0.1:9/mcp")
    resp = world.client(admin=True).post("/api/v1/admin/bindings/", {
        "agent": agent.pk, "kind": "mcp_server", "mcp_server": server.pk,
        "config": {"elicitation_timeout_seconds": timeout},
    }, format="json")
    assert resp.status_code == 400, resp.content
    assert "elicitation_timeout_seconds must be a whole number of seconds from 1 to 604800" in resp.content.decode()
    ok = world.client(admin=True).post("/api/v1/admin/bindings/", {
        "agent": agent.pk, "kind": "mcp_server", "mcp_server": server.pk, "config": {"elicitation_timeout_seconds": 600},
    }, format="json")
    assert ok.status_code == 201, ok.content


async def test_a_run_nobody_watches_gets_the_configured_answer(world, fake_llm, travel_url):
    agent = await _agent(world, fake_llm.base_url, travel_url)
    fake_llm.script(ToolCalls([("travel__book", {})]), Reply("Could not book."))

    @database_sync_to_async
    def post_unattended():
        with unattended_runs():  # as the OpenAI-compatible API, A2A and agents over MCP post
            return post_message_sync(agent=agent, user=world.member, content="Book me a trip")

    run = await post_unattended()
    await execute_run(run.pk)
    run, approvals, [call] = await _state(run.pk)
    assert (run.status, approvals) == ("completed", []), run.error
    assert "not booked: decline" in call.result


@pytest.mark.parametrize(("action", "status", "text"), [
    ("accept", "succeeded", "connected"),  # decline: the chat app's test (test_chat_elicitation)
])
async def test_url_elicitation_required_pauses_then_the_call_is_made_again(world, fake_llm, travel_url, action,
                                                                           status, text):
    agent = await _agent(world, fake_llm.base_url, travel_url)
    fake_llm.script(ToolCalls([("travel__connect", {"account": action})]), Reply("Done."))
    run = await post_message(agent=agent, user=world.member, content="Connect my files")
    await execute_run(run.pk)
    run, [approval], _ = await _state(run.pk)
    assert run.status == "awaiting_approval", run.error
    item = (await _get(world, f"/api/v1/approvals/{approval.pk}/")).json()
    assert (item["kind"], item["mode"], item["url"], item["message"], item["schema"]) == (
        "elicitation", "url", SIGN_IN_URL, "Sign in to your files", None)
    resp = await _post(world, f"/api/v1/approvals/{approval.pk}/", {"action": action})
    assert resp.status_code == 200, resp.content
    await execute_run(run.pk)
    run, _, [call] = await _state(run.pk)
    assert (run.status, call.status) == ("completed", status), run.error
    assert text in (call.result or call.error)


async def test_a_2025_server_asking_inside_the_call_is_held_open_without_a_worker(world, fake_llm, travel_url,
                                                                                 monkeypatch):
    """Protocol 2025-11-25: ``elicitation/create`` arrives inside the open call. The run pauses
    (no worker); the call stays open in this process's MCP pool (an asyncio task, no thread)
    and gets the answer when the run resumes here. In another process it is lost: the call
    fails with a reason the model reads."""
    import dataclasses

    from capabilities import services
    from capabilities.mcp import elicitation

    config = services.mcp_server_config
    monkeypatch.setattr(services, "mcp_server_config",
                        lambda **kw: dataclasses.replace(config(**kw), protocol_mode="legacy"))
    agent = await _agent(world, fake_llm.base_url, travel_url)
    fake_llm.script(ToolCalls([("travel__book", {})]), Reply("Booked."), ToolCalls([("travel__book", {})]),
                    Reply("Lost."))
    run = await post_message(agent=agent, user=world.member, content="Book me a trip")
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, run.heartbeat_at, approval.kind) == ("awaiting_approval", None, "elicitation"), run.error
    [session] = mcp_pool().sessions
    assert (session.protocol_version, session._in_flight) == ("2025-11-25", 1)  # the held call, in no worker
    resp = await _post(world, f"/api/v1/approvals/{approval.pk}/",
                       {"action": "accept", "content": {"city": "Oslo", "days": 2}})
    assert resp.status_code == 200, resp.content
    await execute_run(run.pk)
    run, _, [call] = await _state(run.pk)
    assert (run.status, call.status) == ("completed", "succeeded"), run.error
    assert "booked Oslo for 2 days" in call.result and session._in_flight == 0

    second = await post_message(agent=agent, user=world.member, content="Again")
    await execute_run(second.pk)
    _, [approval], _ = await _state(second.pk)
    elicitation._held.clear()  # as if another worker process resumed the run
    await _post(world, f"/api/v1/approvals/{approval.pk}/", {"action": "decline"})
    await execute_run(second.pk)
    second, _, [call] = await _state(second.pk)
    assert (second.status, call.status) == ("completed", "failed") and "call is lost" in call.error


async def test_a_held_2025_call_gives_up_after_the_bindings_elicitation_timeout(world, fake_llm, travel_url,
                                                                               monkeypatch):
    """2025-11-25: the call held open for the person's answer waits the binding's
    ``elicitation_timeout_seconds`` (plus the grace, 0 here), not ``APPROVAL_TTL_SECONDS``: the
    server gets ``decline`` and the call ends in the pool."""
    import asyncio
    import dataclasses

    from capabilities import services
    from capabilities.mcp import pool as pool_module

    config = services.mcp_server_config
    monkeypatch.setattr(services, "mcp_server_config",
                        lambda **kw: dataclasses.replace(config(**kw), protocol_mode="legacy"))
    monkeypatch.setattr(pool_module, "HELD_GRACE_SECONDS", 0)
    agent = await _agent(world, fake_llm.base_url, travel_url, config={"elicitation_timeout_seconds": 1})
    fake_llm.script(ToolCalls([("travel__book", {})]), Reply("Booked."))
    run = await post_message(agent=agent, user=world.member, content="Book me a trip")
    await execute_run(run.pk)
    assert (await _state(run.pk))[0].status == "awaiting_approval"
    [session] = mcp_pool().sessions
    [held] = session._holds
    assert (session._in_flight, held.elicitation_wait_seconds) == (1, 1)
    result = await asyncio.wait_for(held.task, timeout=10)  # the server had its decline after 1 s
    assert "not booked: decline" in str(result) and session._in_flight == 0
