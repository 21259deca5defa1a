"""The agents' MCP server (/mcp/agents/) on the real ASGI app (uvicorn), with the official `mcp`
SDK client at both protocol revisions the SDK serves (2025-11-25 through the initialize
handshake, 2026-07-28 stateless): one tool per active agent of the token's tenant, a call is an
ordinary run of the test fake model answered as text and structured content with progress on
the way, a chat continues by chat_id, a busy chat / bad arguments are tool errors, an unknown
tool the protocol's error, a cancelled call cancels the run, a run waiting for an approval
answers with the chat app's URL, and the HTTP edge refuses what it must."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agents.tests.factories import AgentFactory, agent_with_route, bind_builtin
from llm.testing import Delay, Fail, Hang, Reply, ToolCalls
from sessions.models import ChatSession, Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("all_tenants_scope"),
]

MODES = ["legacy", "2026-07-28"]
"""The SDK client's ``mode``: the initialize handshake (2025-11-25), or the stateless revision."""


@asynccontextmanager
async def connected(live_server_url: str, token: str, mode: str, **options: Any):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=90))
    async with http, Client(streamable_http_client(f"{live_server_url}/mcp/agents/", http_client=http), mode=mode,
                            **options) as client:
        yield client


def run_async(fn: Callable[[], Any]) -> Any:
    return anyio.run(fn)


def wait_until(check: Callable[[], bool], timeout_seconds: float = 20) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("mode", [*MODES, "auto"])
def test_the_tools_are_the_callers_active_agents(world, other_world, live_server_url, mode):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Docs assistant",
                     description="Answers from the handbook.")
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Retired", is_active=False)
    AgentFactory(tenant=other_world.tenant, name="Globex helper")

    async def listed():
        async with connected(live_server_url, world.member_token, mode) as client:
            return client.session.protocol_version, (await client.list_tools()).tools

    version, tools = run_async(listed)
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")  # auto: server/discover finds 2026-07-28
    assert [tool.name for tool in tools] == ["docs-assistant"]
    tool = tools[0]
    assert (tool.title, tool.description) == ("Docs assistant", "Answers from the handbook.")
    assert tool.input_schema["required"] == ["message"]
    assert set(tool.input_schema["properties"]) == {"message", "chat_id", "version"}
    assert set(tool.output_schema["required"]) == {"reply", "chat_id", "run_id", "citations", "status"}


@pytest.mark.parametrize("mode", MODES)
def test_a_call_is_a_run_answered_with_progress_and_continued_by_chat_id(world, fake_llm, celery_worker,
                                                                         live_server_url, mode):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Echoer")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]), Reply("It said hello."), Reply("Still hello."))
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def calls():
        async with connected(live_server_url, world.member_token, mode) as client:
            first = await client.call_tool("echoer", {"message": "say hello"}, progress_callback=on_progress)
            chat_id = first.structured_content["chat_id"]
            second = await client.call_tool("echoer", {"message": "again", "chat_id": chat_id})
            return first, second

    first, second = run_async(calls)
    assert not first.is_error and first.content[0].text == "It said hello."
    data = first.structured_content
    assert (data["reply"], data["status"], data["citations"]) == ("It said hello.", "completed", [])
    run = Run.all_tenants.get(pk=int(data["run_id"]))
    assert (run.status, run.input, run.reply, run.user_id) == ("completed", "say hello", "It said hello.",
                                                                world.member.pk)
    assert run.session_id == int(data["chat_id"]) and ChatSession.all_tenants.get(pk=run.session_id).agent_id == agent.pk
    assert run.purpose == "api"  # counted in usage and budgets as the API's, not the chat app's
    usage = world.client(admin=True).get("/api/v1/admin/usage/").json()
    assert [row["run_purpose"] for row in usage["by_run_purpose"]] == ["api"]
    values = [value for value, _ in progress]
    assert values == sorted(set(values)) and len(values) >= 3, progress
    messages = [message for _, message in progress]
    assert "Calling test_echo…" in messages and "test_echo answered." in messages

    assert second.structured_content["reply"] == "Still hello."
    assert second.structured_content["chat_id"] == data["chat_id"]
    assert [(m["role"], m.get("content")) for m in fake_llm.requests[2]["messages"] if m["role"] == "user"] == [
        ("user", "say hello"), ("user", "again"),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_refusals_are_tool_errors_and_an_unknown_tool_the_protocols_error(world, other_world, fake_llm,
                                                                         celery_worker, live_server_url, mode):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    theirs = AgentFactory(tenant=other_world.tenant, name="Globex helper")
    fake_llm.script(Reply("first"), Delay(3, Reply("slow")))

    async def calls():
        results: dict[str, Any] = {}
        async with connected(live_server_url, world.member_token, mode) as client:
            for name in (theirs.slug, "nope"):
                with pytest.raises(MCPError) as caught:
                    await client.call_tool(name, {"message": "hi"})
                results[name] = caught.value.error
            with pytest.raises(MCPError) as caught:  # the tool is looked for before its arguments
                await client.call_tool("nope", {})
            results["nope-without-arguments"] = caught.value.error
            results["bad"] = await client.call_tool("helper", {"message": ""})
            results["extra"] = await client.call_tool("helper", {"message": "hi", "model": "x"})
            first = await client.call_tool("helper", {"message": "one"})
            chat_id = first.structured_content["chat_id"]
            async with anyio.create_task_group() as group:
                group.start_soon(client.call_tool, "helper", {"message": "two", "chat_id": chat_id})
                await anyio.to_thread.run_sync(lambda: fake_llm.wait_for_requests(2, timeout_seconds=10))
                results["busy"] = await client.call_tool("helper", {"message": "three", "chat_id": chat_id})
        return results

    results = run_async(calls)
    for name in (theirs.slug, "nope", "nope-without-arguments"):
        assert results[name].code == types.INVALID_PARAMS and "Unknown tool" in results[name].message
    assert results["bad"].is_error and "message must be a non-empty string" in results["bad"].content[0].text
    assert results["extra"].is_error and "Unknown arguments ['model']" in results["extra"].content[0].text
    assert results["busy"].is_error and "run in progress" in results["busy"].content[0].text


@pytest.mark.parametrize("mode", MODES)
def test_another_users_chat_and_a_failed_run_are_tool_errors(world, fake_llm, celery_worker, live_server_url, mode):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("the admin's"), Fail(status=400))

    async def calls():
        async with connected(live_server_url, world.admin_token, mode) as client:
            admins = await client.call_tool("helper", {"message": "mine"})
        async with connected(live_server_url, world.member_token, mode) as client:
            peek = await client.call_tool("helper", {"message": "peek",
                                                     "chat_id": admins.structured_content["chat_id"]})
            failed = await client.call_tool("helper", {"message": "fail please"})
        return peek, failed

    peek, failed = run_async(calls)
    assert peek.is_error and "No chat" in peek.content[0].text
    assert failed.is_error and failed.content[0].text.startswith("The run failed")


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_call_cancels_the_run(world, fake_llm, celery_worker, live_server_url, mode):
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Slow")
    fake_llm.script(Hang(60))

    async def cancelled():
        async with connected(live_server_url, world.member_token, mode) as client:
            with anyio.move_on_after(30):
                async with anyio.create_task_group() as group:
                    group.start_soon(client.call_tool, "slow", {"message": "take your time"})
                    await anyio.to_thread.run_sync(lambda: fake_llm.wait_for_requests(1, timeout_seconds=20))
                    group.cancel_scope.cancel()
            await anyio.sleep(0.5)  # the legacy client posts notifications/cancelled after the cancel

    run_async(cancelled)
    run = Run.all_tenants.get(session__agent__slug="slow")
    assert wait_until(lambda: Run.all_tenants.get(pk=run.pk).status == "cancelled"), Run.all_tenants.get(pk=run.pk)


@pytest.mark.parametrize("mode", MODES)
def test_a_run_awaiting_approval_says_where_to_decide(world, fake_llm, celery_worker, live_server_url, mode):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]))

    async def call():
        async with connected(live_server_url, world.member_token, mode) as client:
            return await client.call_tool("careful", {"message": "echo hello"})

    result = run_async(call)
    data = result.structured_content
    assert not result.is_error and data["status"] == "awaiting_approval"
    assert data["approval_url"] == f"{live_server_url}/#/sessions/{data['chat_id']}"
    assert data["approval_url"] in result.content[0].text and "test_echo" in result.content[0].text
    assert Run.all_tenants.get(pk=int(data["run_id"])).status == "awaiting_approval"


def test_a_2026_client_with_url_elicitation_gets_the_approval_as_one(world, fake_llm, celery_worker,
                                                                    live_server_url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]))

    async def elicit(context, params):
        return types.ElicitResult(action="decline")

    async def call():
        async with connected(live_server_url, world.member_token, "2026-07-28", elicitation_callback=elicit) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("careful", {"message": "echo hello"})
            return caught.value.error

    error = run_async(call)
    assert error.code == types.URL_ELICITATION_REQUIRED
    [elicitation] = error.data["elicitations"]
    chat_id = Run.all_tenants.get(session__agent=agent).session_id
    assert (elicitation["mode"], elicitation["url"]) == ("url", f"{live_server_url}/#/sessions/{chat_id}")


def test_a_2025_11_25_client_with_url_elicitation_gets_the_approval_as_one(world, fake_llm, celery_worker,
                                                                          live_server_url):
    """2025-11-25 defines URL-mode elicitation too; its handshake-era client declares it at
    ``initialize`` (a POST of its own on this stateless server), so the server's session id says
    so on the later calls. The error's elicitations carry the ``elicitationId`` that revision
    requires. A client that declared no URL mode gets the tool result (the test above)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]))

    async def elicit(context, params):
        return types.ElicitResult(action="decline")

    async def call(token: str):
        async with connected(live_server_url, token, "legacy", elicitation_callback=elicit) as client:
            assert client.session.protocol_version == "2025-11-25"
            with pytest.raises(MCPError) as caught:
                await client.call_tool("careful", {"message": "echo hello"})
            return caught.value.error

    error = run_async(lambda: call(world.member_token))
    assert error.code == types.URL_ELICITATION_REQUIRED
    [elicitation] = error.data["elicitations"]
    chat_id = Run.all_tenants.get(session__agent=agent).session_id
    assert (elicitation["mode"], elicitation["url"]) == ("url", f"{live_server_url}/#/sessions/{chat_id}")
    assert elicitation["elicitationId"]


def test_a_session_id_of_another_credential_declares_nothing(world, fake_llm, celery_worker, live_server_url):
    """The session id the server gives at ``initialize`` is bound to the credential: sent with
    another token (or forged) it is ignored, and the approval comes as the tool result."""
    from sessions.api import mcp_agents

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "hello"})]))
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {world.member_token}"}
    url = f"{live_server_url}/mcp/agents/"
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "clientInfo": {"name": "t", "version": "1"},
        "capabilities": {"elicitation": {"url": {}}}}}
    answer = httpx.post(url, json=initialize, headers=headers)
    assert answer.status_code == 200 and answer.headers["Mcp-Session-Id"]
    other = mcp_agents._url_session_id("token:0")
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "careful", "arguments": {"message": "echo hello"}}}
    reply = httpx.post(url, json=call, timeout=60, headers={**headers, "MCP-Protocol-Version": "2025-11-25",
                                                            "Mcp-Session-Id": other})
    assert reply.status_code == 200 and '"awaiting_approval"' in reply.text and "-32042" not in reply.text


def test_the_http_edge_refuses_what_it_must(world, live_server_url):
    url = f"{live_server_url}/mcp/agents/"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx.post(url, json=body, headers=accept).status_code == 401
    bad = httpx.post(url, json=body, headers={**accept, "Authorization": "Bearer ap_nope"})
    assert bad.status_code == 401 and bad.headers["WWW-Authenticate"].startswith("Bearer")
    assert httpx.get(url, headers={"Authorization": f"Bearer {world.member_token}"}).status_code == 405
    evil = httpx.post(url, json=body, headers={**accept, "Host": "evil.example",
                                                "Authorization": f"Bearer {world.member_token}"})
    assert evil.status_code == 400
    ok = httpx.post(url, json=body, headers={**accept, "Authorization": f"Bearer {world.member_token}",
                                             "MCP-Protocol-Version": "2025-11-25"})
    assert ok.status_code == 200 and ok.headers["X-Content-Type-Options"] == "nosniff"
    auth = {"Authorization": f"Bearer {world.member_token}"}
    not_json = httpx.post(url, content=b"{}", headers={**accept, **auth, "Content-Type": "text/plain"})
    assert not_json.status_code == 415 and not_json.json()["extra"] == {"content_type": "text/plain"}
    for revision in ("2025-11-25", "2026-07-28"):  # the SDK's 2026-07-28 transport answers an empty 406
        json_only = httpx.post(url, json=body, headers={**auth, "Accept": "application/json",
                                                        "MCP-Protocol-Version": revision})
        assert json_only.status_code == 406 and json_only.json()["error"]["code"] == -32600, json_only.content


def test_a_cancel_notification_on_another_connection_cancels_the_call_of_its_token(world, fake_llm, celery_worker,
                                                                                   live_server_url):
    """2025-11-25: ``notifications/cancelled`` arrives as a POST of its own (any web process may
    answer it); it cancels the run of the call in flight under that request id, for the token
    that made the call only. The call's stream stays open and answers the cancellation."""
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Slow")
    fake_llm.script(Hang(60))
    url = f"{live_server_url}/mcp/agents/"
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    call = {"jsonrpc": "2.0", "id": "call-7", "method": "tools/call",
            "params": {"name": "slow", "arguments": {"message": "take your time"}}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "call-7"}}
    answer: list[str] = []

    def calling() -> None:
        with httpx.stream("POST", url, json=call, timeout=60,
                          headers={**headers, "Authorization": f"Bearer {world.member_token}"}) as response:
            answer.append(response.read().decode())

    thread = threading.Thread(target=calling)
    thread.start()
    assert fake_llm.wait_for_requests(1, timeout_seconds=20)
    run = Run.all_tenants.get(session__agent__slug="slow")
    for token in (world.admin_token, world.member_token):  # another token's notification finds no call
        sent = httpx.post(url, json=cancel, headers={**headers, "Authorization": f"Bearer {token}"})
        assert sent.status_code == 202
        if token == world.admin_token:
            time.sleep(1)
            assert Run.all_tenants.get(pk=run.pk).status == "running"
    assert wait_until(lambda: Run.all_tenants.get(pk=run.pk).status == "cancelled")
    thread.join(timeout=30)
    assert '"isError":true' in answer[0] and "The run was cancelled." in answer[0]


@pytest.mark.parametrize("mode", MODES)
def test_throttled_and_over_budget_are_tool_errors_with_the_reason(world, fake_llm, celery_worker, live_server_url,
                                                                   settings, mode):
    rates = dict.fromkeys(settings.API_THROTTLE_RATES, "")
    rates["runs.user"] = "2/minute"
    settings.API_THROTTLE_RATES = rates
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Frugal", max_tokens_per_run=5)
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.script(Reply("fine"))

    async def calls():
        async with connected(live_server_url, world.member_token, mode) as client:
            over = await client.call_tool("frugal", {"message": "a question long enough to cost more than five tokens"})
            fine = await client.call_tool("helper", {"message": "hi"})
            throttled = await client.call_tool("helper", {"message": "hi again"})
            return over, fine, throttled

    over, fine, throttled = run_async(calls)
    assert over.is_error and over.content[0].text.startswith("Over budget:") and "5 tokens" in over.content[0].text
    assert not fine.is_error and fine.structured_content["reply"] == "fine"
    assert throttled.is_error and throttled.content[0].text.startswith("Too many requests")
    assert "Try again in" in throttled.content[0].text
    assert Run.all_tenants.filter(session__agent__slug="helper").count() == 1


def test_a_2025_client_that_goes_away_has_not_cancelled(world, fake_llm, celery_worker, live_server_url):
    """2025-11-25: a disconnection is not a cancellation (the client cancels with
    notifications/cancelled): the run goes on and its answer lands in the chat."""
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Slow")
    fake_llm.script(Delay(2, Reply("done anyway")))
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "slow", "arguments": {"message": "take your time"}}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25",
               "Authorization": f"Bearer {world.member_token}"}

    def calling() -> None:
        with httpx.stream("POST", f"{live_server_url}/mcp/agents/", json=call, headers=headers, timeout=60):
            assert fake_llm.wait_for_requests(1, timeout_seconds=20)  # then the connection closes

    calling()
    run = Run.all_tenants.get(session__agent__slug="slow")
    assert wait_until(lambda: Run.all_tenants.get(pk=run.pk).status == "completed"), Run.all_tenants.get(pk=run.pk)
    assert Run.all_tenants.get(pk=run.pk).reply == "done anyway"


def test_the_passages_a_run_searched_are_its_citations(world, fake_llm, embedding_server, celery_worker,
                                                       live_server_url, monkeypatch):
    from knowledge.tests.test_kind import KITCHEN, SAILING, _agent, _kb

    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)
    kb = _kb(world.tenant, embedding_server, "Club", SAILING, KITCHEN)
    _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 2}, name="Club helper")
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "When does the boathouse open?"})]),
                    Reply("It opens at 8 [1]."))

    async def call():
        async with connected(live_server_url, world.member_token, "2026-07-28") as client:
            return await client.call_tool("club-helper", {"message": "When does the boathouse open?"})

    result = run_async(call)
    data = result.structured_content
    assert data["reply"] == "It opens at 8 [1]."
    assert [c["n"] for c in data["citations"]] == [1, 2]
    assert data["citations"][0]["document_title"] == "Sailing club handbook"
    assert {"chunk_id", "knowledge_base_id", "heading", "score"} <= set(data["citations"][0])
