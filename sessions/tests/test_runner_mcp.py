"""The runner with a real MCP server (mcp-server-time over stdio) bound to the agent."""

from __future__ import annotations

import sys

import pytest
from channels.db import database_sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.models import McpServer
from llm.testing import Reply, ToolCalls
from sessions.models import ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_enqueue")]


@database_sync_to_async
def agent_with_time_server(world, url, *, command=sys.executable, allowed=()):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    server = McpServer.all_tenants.create(
        tenant=world.tenant, name="time", alias="time", transport="stdio", command=command,
        args=["-m", "mcp_server_time", "--local-timezone", "UTC"],
    )
    CapabilityBinding.all_tenants.create(
        tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server, allowed_tools=list(allowed)
    )
    return agent


@database_sync_to_async
def tool_calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


async def test_get_current_time_through_a_real_stdio_mcp_server(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url)
    fake_llm.script(
        ToolCalls([("get_current_time", {"timezone": "Asia/Tokyo"}), ("get_current_time", {"timezone": "Not/AZone"})]),
        Reply("It is late in Tokyo."),
    )
    run = await post_message(agent=agent, user=world.member, content="What time is it in Tokyo?")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.error
    tokyo, bad = await tool_calls(run.pk)
    assert tokyo.status == "succeeded" and "Asia/Tokyo" in tokyo.result
    assert bad.status == "failed" and bad.error, "an MCP error is a failed call whose reason the model reads"
    offered = sorted(t["function"]["name"] for t in fake_llm.requests[0]["tools"])
    assert offered == ["convert_time", "get_current_time"]
    tool_messages = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert "Asia/Tokyo" in tool_messages[0]["content"] and tool_messages[1]["content"].startswith("Error: ")


async def test_the_binding_allow_list_limits_the_tools_offered(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url, allowed=["convert_time"])
    fake_llm.script(ToolCalls([("get_current_time", {"timezone": "UTC"})]), Reply("I cannot."))
    run = await post_message(agent=agent, user=world.member, content="time?")
    await execute_run(run.pk)
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == ["convert_time"]
    [call] = await tool_calls(run.pk)
    assert call.status == "failed" and "Unknown tool 'get_current_time'" in call.error


async def test_an_mcp_server_that_cannot_start_fails_the_run_with_a_reason(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url, command="/nonexistent/mcp-server")
    run = await post_message(agent=agent, user=world.member, content="time?")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "capability_unavailable")
    assert "'time'" in run.error
    assert fake_llm.requests == []
