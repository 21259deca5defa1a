"""A run that needs an OAuth MCP server nobody has connected (issue 37: the Connect card).

Against the platform's own OAuth-protected MCP server (/mcp/knowledge/ on the live server): in a
run a person watches, the unconnected server is offered as one stand-in tool,
``<alias>__connect``; the model calls it, the run pauses (an Approval of kind ``connection``, no
worker holding it), the person connects (the real authorization flow and callback) and the run
resumes on its own with the server's tools. Also: Continue without, expiry, a run nobody watches
(no stand-in), and a call the server refuses the account for mid-run (it waits for the account
to be connected again, then is made again)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.mcp_oauth.tests.test_end_to_end import _connect
from capabilities.models import McpServer
from llm.testing import Reply, ToolCalls
from oauth_server.models import McpGrant
from oauth_server.services import mcp_grant_revoke
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.runs.approvals import approvals_expire
from sessions.runs.transitions import unattended_runs
from sessions.tests.conftest import post_message
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("no_enqueue", "all_tenants_scope"),
]


@pytest.fixture
async def pool_closed():
    """The MCP pool is closed before the live server's next test (a session would outlive it)."""
    yield
    await mcp_pool().aclose()


@database_sync_to_async
def _agent(world, llm_url: str, server_url: str, auth_mode: str = "oauth_user") -> tuple:
    agent = agent_with_route(tenant=world.tenant, base_urls=[llm_url])
    server = McpServer.all_tenants.create(tenant=world.tenant, name="Our knowledge", alias="ourkb",
                                          transport="streamable_http", url=server_url, auth_mode=auth_mode)
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                         mcp_server=server,
                                         # would ask for the stand-in if its approval rules applied
                                         approval_policy=[{"pattern": "*connect", "action": "ask"}])
    return agent, server


@database_sync_to_async
def _state(run_id: int) -> tuple[Run, list[Approval], list[ToolCall]]:
    run = Run.all_tenants.get(pk=run_id)
    return (run, list(Approval.all_tenants.filter(run_id=run_id).order_by("pk")),
            list(ToolCall.all_tenants.filter(run_id=run_id).order_by("pk")))


@database_sync_to_async
def _api(world, method: str, path: str, body=None):
    return getattr(world.client(), method)(path, body, format="json")


def _offered(request: dict) -> list[str]:
    return sorted(tool["function"]["name"] for tool in request.get("tools") or ())


async def _paused_on_connect(world, fake_llm, server_url: str, *after, auth_mode: str = "oauth_user"):
    agent, server = await _agent(world, fake_llm.base_url, server_url, auth_mode)
    fake_llm.script(ToolCalls([("ourkb__connect", {})]), *after)
    run = await post_message(agent=agent, user=world.member, content="Which knowledge bases do I have?")
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, call.status, approval.kind) == ("awaiting_approval", "awaiting_approval", "connection"), run.error
    assert run.heartbeat_at is None  # no worker holds the run while the person connects
    return run, approval, server


async def test_the_model_asks_to_connect_and_the_run_goes_on_with_the_servers_tools(
        world, fake_llm, live_server_url, settings, monkeypatch, pool_closed):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    run, approval, server = await _paused_on_connect(
        world, fake_llm, f"{live_server_url}/mcp/knowledge/",
        ToolCalls([("ourkb__knowledge_bases", {})]), Reply("You have none yet."))
    assert _offered(fake_llm.requests[0]) == ["ourkb__connect"]  # the stand-in, not the server's tools
    assert "connect" in approval.reason.lower()  # why: not connected yet

    item = (await _api(world, "get", f"/api/v1/approvals/{approval.pk}/")).json()
    assert (item["kind"], item["server"], item["can_decide"]) == ("connection", "ourkb", True)
    assert item["connection"] == {"server": "ourkb", "server_id": server.pk, "server_name": "Our knowledge",
                                  "auth_mode": "oauth_user", "tool": "connect", "retry": False,
                                  "message": item["message"]}
    early = await _api(world, "post", f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"})
    assert early.status_code == 409 and "Not connected yet" in early.json()["message"]

    api = await sync_to_async(_http_api)(world, live_server_url)
    await sync_to_async(_connect, thread_sensitive=False)(world, server, live_server_url, api, monkeypatch)
    run, [approval], _ = await _state(run.pk)
    assert (approval.status, approval.answer, approval.decided_by_id) == ("answered", "connected", world.member.pk)
    assert run.status == "queued"  # the connection resumed it

    await execute_run(run.pk)
    run, _, [connect, listed] = await _state(run.pk)
    assert (run.status, run.reply) == ("completed", "You have none yet."), run.error
    assert connect.status == "succeeded" and "connected" in connect.result
    assert (listed.status, listed.result) == ("succeeded", "No knowledge bases.")
    assert "ourkb__knowledge_bases" in _offered(fake_llm.requests[1])  # the resumed run has the real tools
    assert "ourkb__connect" not in _offered(fake_llm.requests[1])


async def test_the_tenants_account_to_connect_is_in_the_admins_inbox_too(world, fake_llm, pool_closed):
    # Only a tenant admin may connect the tenant's account (oauth_tenant); its connection
    # approval went to the run's user alone, who can only go on without it, and no admin saw it.
    run, approval, server = await _paused_on_connect(world, fake_llm, "http://127.0.0.1:9/mcp/", auth_mode="oauth_tenant")
    assert approval.approvers == {"requester": True, "roles": ["admin", "owner"], "user_ids": []}
    as_admin = await sync_to_async(lambda: world.client(admin=True).get("/api/v1/approvals/?mine=approver"))()
    [item] = [a for a in as_admin.json() if a["id"] == approval.pk]
    assert (item["kind"], item["can_decide"], item["connection"]["auth_mode"]) == ("connection", True, "oauth_tenant")
    mine = (await _api(world, "get", f"/api/v1/approvals/{approval.pk}/")).json()
    assert mine["can_decide"] is True  # the run's user may still go on without it


def _http_api(world, live_server_url: str):
    import httpx

    return httpx.Client(base_url=live_server_url, headers={"Authorization": f"Bearer {world.member_token}"},
                        timeout=60)


async def test_continue_without_fails_the_stand_in_and_the_run_goes_on(world, fake_llm, pool_closed):
    run, approval, _ = await _paused_on_connect(world, fake_llm, "http://127.0.0.1:9/mcp/", Reply("Without it, then."))
    answer = await _api(world, "post", f"/api/v1/approvals/{approval.pk}/", {"decision": "deny"})
    assert answer.status_code == 200, answer.content
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, approval.status) == ("completed", "denied"), run.error
    assert call.status == "failed" and "chose not to connect the account for Our knowledge" in call.error


async def test_nobody_connecting_in_time_fails_the_stand_in(world, fake_llm, pool_closed):
    run, approval, _ = await _paused_on_connect(world, fake_llm, "http://127.0.0.1:9/mcp/", Reply("Later, then."))

    @database_sync_to_async
    def expire():
        with tenant_scope(world.tenant.pk), transaction.atomic():
            return approvals_expire(now=timezone.now() + timedelta(days=30), run_ids=[run.pk])

    assert await expire() == 0  # the run is not failed: the call is
    await execute_run(run.pk)
    run, [approval], [call] = await _state(run.pk)
    assert (run.status, approval.status) == ("completed", "expired"), run.error
    assert call.status == "failed" and "Nobody connected the account" in call.error


async def test_a_run_nobody_watches_is_offered_no_stand_in(world, fake_llm, pool_closed):
    agent, _ = await _agent(world, fake_llm.base_url, "http://127.0.0.1:9/mcp/")
    fake_llm.script(Reply("No tools here."))

    @database_sync_to_async
    def post():
        from sessions.tests.conftest import post_message_sync

        with unattended_runs():
            return post_message_sync(agent=agent, user=world.member, content="Which knowledge bases?")

    run = await post()
    await execute_run(run.pk)
    run, approvals, _ = await _state(run.pk)
    assert (run.status, approvals) == ("completed", []), run.error
    assert "ourkb__connect" not in _offered(fake_llm.requests[0])


async def test_a_call_refused_mid_run_waits_for_the_account_and_is_made_again(
        world, fake_llm, live_server_url, settings, monkeypatch, pool_closed):
    """The grant is revoked at the service while the pool still holds the server's session and
    catalogue: the next call is refused (401, the refresh refused too), waits for the account to
    be connected again, and is made again once it is."""
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    agent, server = await _agent(world, fake_llm.base_url, f"{live_server_url}/mcp/knowledge/")
    api = await sync_to_async(_http_api)(world, live_server_url)
    await sync_to_async(_connect, thread_sensitive=False)(world, server, live_server_url, api, monkeypatch)

    fake_llm.script(ToolCalls([("ourkb__knowledge_bases", {})]), Reply("First."))
    first = await post_message(agent=agent, user=world.member, content="Which knowledge bases?")
    await execute_run(first.pk)
    assert (await _state(first.pk))[0].status == "completed"

    @database_sync_to_async
    def revoke_at_the_service():
        with tenant_scope(world.tenant.pk):
            for grant in McpGrant.objects.all():
                mcp_grant_revoke(grant=grant)

    await revoke_at_the_service()
    fake_llm.script(ToolCalls([("ourkb__knowledge_bases", {})]), Reply("Second."))
    second = await post_message(agent=agent, user=world.member, content="And now?")
    await execute_run(second.pk)
    run, [approval], [call] = await _state(second.pk)
    assert (run.status, approval.kind, call.status) == ("awaiting_approval", "connection", "awaiting_approval"), (
        run.error, call.error)
    item = (await _api(world, "get", f"/api/v1/approvals/{approval.pk}/")).json()
    assert (item["connection"]["retry"], item["connection"]["tool"]) == (True, "knowledge_bases")

    await sync_to_async(_connect, thread_sensitive=False)(world, server, live_server_url, api, monkeypatch)
    assert (await _state(second.pk))[0].status == "queued"
    await execute_run(second.pk)
    run, [approval], [call] = await _state(second.pk)
    assert (run.status, run.reply, approval.status) == ("completed", "Second.", "answered"), run.error
    assert (call.status, call.result) == ("succeeded", "No knowledge bases.")
    connection = await database_sync_to_async(McpOAuthConnection.all_tenants.get)(server=server)
    assert connection.status == "connected"
