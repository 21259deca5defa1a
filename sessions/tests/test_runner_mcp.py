"""The runner with real MCP servers bound to the agent, through the process's MCP pool.

mcp-server-time over stdio (names, allow-lists, session reuse across runs, start failures),
three stdio test servers connected in parallel, and the in-test Streamable HTTP server for
progress events and image artifacts.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.models import McpServer
from capabilities.services import mcp_server_save
from capabilities.tests.catalogue import time_template
from capabilities.tests.mcp_test_server import PNG_BYTES, serve_mcp_http
from llm.testing import Reply, ToolCalls
from sessions.events import events_since
from sessions.models import Artifact, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
async def close_the_mcp_pool():
    """Each test's event loop has its own pool: close it so no server process outlives the test."""
    yield
    await mcp_pool().aclose()


@database_sync_to_async
def agent_with_time_server(world, url, *, program=None, allowed=()):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    template = time_template()
    if program is not None:
        template.argv = [program, *template.argv[1:]]
        template.save()
    server = McpServer.all_tenants.create(
        tenant=world.tenant, name="time", alias="time", transport="stdio", template=template,
        parameters={"TIMEZONE": "UTC"},
    )
    CapabilityBinding.all_tenants.create(
        tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server, allowed_tools=list(allowed)
    )
    return agent


@database_sync_to_async
def bind_servers(world, agent, servers):
    """``servers``: ``[(alias, fields, env)]`` bound to ``agent``; returns the McpServer rows."""
    rows = []
    for alias, fields, env in servers:
        server = mcp_server_save(tenant=world.tenant, env=env, name=alias, alias=alias, **fields)
        CapabilityBinding.all_tenants.create(
            tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server
        )
        rows.append(server)
    return rows


@database_sync_to_async
def tool_calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


@database_sync_to_async
def server_row(alias):
    return McpServer.all_tenants.get(alias=alias)


def time_server_pids() -> set[int]:
    """Live children of this process running mcp_server_time (read from /proc)."""
    me, pids = str(os.getpid()), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if stat[1] == me and stat[0] != "Z" and b"mcp_server_time" in cmdline:
            pids.add(int(entry))
    return pids


async def test_get_current_time_through_a_real_stdio_mcp_server(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url)
    fake_llm.script(
        ToolCalls([("time__get_current_time", {"timezone": "Asia/Tokyo"}),
                   ("time__get_current_time", {"timezone": "Not/AZone"})]),
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
    assert offered == ["time__convert_time", "time__get_current_time"]
    tool_messages = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert "Asia/Tokyo" in tool_messages[0]["content"] and tool_messages[1]["content"].startswith("Error: ")
    # The console's snapshot of the server's tools was stored on the way.
    server = await server_row("time")
    assert sorted(t["name"] for t in server.tools_snapshot) == ["convert_time", "get_current_time"]
    assert server.tools_snapshot_at is not None and server.last_error == ""


async def test_the_binding_allow_list_limits_the_tools_offered(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url, allowed=["convert_time"])
    fake_llm.script(ToolCalls([("time__get_current_time", {"timezone": "UTC"})]), Reply("I cannot."))
    run = await post_message(agent=agent, user=world.member, content="time?")
    await execute_run(run.pk)
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == ["time__convert_time"]
    [call] = await tool_calls(run.pk)
    assert call.status == "failed" and "Unknown tool 'time__get_current_time'" in call.error


async def test_an_mcp_server_that_cannot_start_is_left_out_and_the_run_goes_on(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url, program="/nonexistent/mcp-server")
    fake_llm.script(Reply("I cannot tell the time right now."))
    run = await post_message(agent=agent, user=world.member, content="time?")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", (run.reason, run.error)
    assert "tools" not in fake_llm.requests[0], "the server's tools are not offered"
    events = await events_since(session_id=run.session_id, after_seq=0)
    [unavailable] = [e["data"] for e in events if e["type"] == "capability_unavailable"]
    assert (unavailable["source"], unavailable["alias"]) == ("mcp", "time") and "'time'" in unavailable["error"]
    last_error = (await server_row("time")).last_error
    assert "No such file or directory" in last_error or "FileNotFoundError" in last_error


async def test_a_second_run_reuses_the_pooled_stdio_session(world, fake_llm):
    agent = await agent_with_time_server(world, fake_llm.base_url)
    before = time_server_pids()
    fake_llm.script(
        ToolCalls([("time__get_current_time", {"timezone": "UTC"})]), Reply("Noon."),
        ToolCalls([("time__get_current_time", {"timezone": "Asia/Tokyo"})]), Reply("Nine."),
    )
    first = await post_message(agent=agent, user=world.member, content="time?")
    await execute_run(first.pk)
    spawned = time_server_pids() - before
    assert len(spawned) == 1
    second = await post_message(agent=agent, user=world.member, content="and in Tokyo?")
    await execute_run(second.pk)

    assert (await reload_run(first.pk)).status == (await reload_run(second.pk)).status == "completed"
    assert time_server_pids() - before == spawned, "the same server process served both runs"
    assert mcp_pool().connects == 1
    [call] = await tool_calls(second.pk)
    assert call.status == "succeeded" and "Asia/Tokyo" in call.result


async def test_three_servers_are_connected_in_parallel(world, fake_llm, settings):
    """Each confined test server waits 3 s before it answers and notes when it started: connected
    one after the other they would start at least 3 s apart; in parallel, together.

    The checkout is bound read-only by the deployment's setting (a template may not bind a path
    under /tmp, where a CI clone may live)."""
    from capabilities.tests.catalogue import template

    settings.SANDBOX_RO_BINDS = [*settings.SANDBOX_RO_BINDS, str(REPO_ROOT)]
    agent = await database_sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url])
    test_server = await database_sync_to_async(template)(
        "mcp-test-server", kind="mcp_stdio", argv=["${PYTHON}", "-m", "capabilities.tests.mcp_test_server"],
        env={"PYTHONPATH": str(REPO_ROOT), "MCP_TEST_START_DELAY": "3"},
    )
    fields = {"transport": "stdio", "template": test_server, "connect_timeout_seconds": 20.0}
    await bind_servers(world, agent, [(alias, fields, None) for alias in ("one", "two", "three")])
    fake_llm.script(
        ToolCalls([(f"{alias}__getenv", {"name": "MCP_TEST_STARTED_AT"}) for alias in ("one", "two", "three")]),
        Reply("Done."),
    )
    run = await post_message(agent=agent, user=world.member, content="echo")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.error
    offered = {t["function"]["name"] for t in fake_llm.requests[0]["tools"]}
    assert {"one__echo", "two__echo", "three__echo"} <= offered
    calls = await tool_calls(run.pk)
    assert [c.status for c in calls] == ["succeeded"] * 3, [c.error for c in calls]
    started = [float(re.search(r"\d{9,}\.\d+", c.result).group()) for c in calls]
    assert max(started) - min(started) < 2.5, started


@database_sync_to_async
def artifacts_of(run_id):
    return list(Artifact.all_tenants.filter(run_id=run_id).order_by("id"))


async def test_progress_events_and_image_artifacts_through_the_runner(world, fake_llm):
    agent = await database_sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url])
    with serve_mcp_http() as server:
        await bind_servers(world, agent, [("web", {"transport": "streamable_http", "url": server.url}, None)])
        fake_llm.script(ToolCalls([("web__progress", {"steps": 2}), ("web__media", {})]), Reply("Here."))
        run = await post_message(agent=agent, user=world.member, content="go")
        await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.error
    progress_call, media_call = await tool_calls(run.pk)
    events = await events_since(session_id=run.session_id, after_seq=0)
    progress = [e["data"] for e in events if e["type"] == "tool_call_progress"]
    assert progress == [
        {"tool_call_id": progress_call.pk, "message": "step 1 of 2", "progress": 1.0, "total": 2.0},
        {"tool_call_id": progress_call.pk, "message": "step 2 of 2", "progress": 2.0, "total": 2.0},
    ]
    [image, audio] = await artifacts_of(run.pk)
    assert (image.mime_type, bytes(image.content), image.tool_call_id) == ("image/png", PNG_BYTES, media_call.pk)
    assert audio.mime_type == "audio/wav"
    assert f"[image: artifact:{image.pk}, image/png, 100 bytes]" in media_call.result
    assert any(e["type"] == "artifact_updated" and e["data"]["artifact_id"] == image.pk for e in events)


async def test_cancelling_a_run_cancels_only_its_own_call_on_a_shared_session(world, fake_llm):
    from sessions.tests.test_cancellation import cancel

    agent = await database_sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url])
    with serve_mcp_http() as server:
        await bind_servers(world, agent, [("web", {"transport": "streamable_http", "url": server.url}, None)])
        fake_llm.script(
            ToolCalls([("web__hang", {})]),  # run A
            ToolCalls([("web__sleep_echo", {"text": "mine", "seconds": 0.5})]),  # run B
            Reply("B is done."),  # run B, after its tool
        )
        run_a = await post_message(agent=agent, user=world.member, content="hang")
        task_a = asyncio.create_task(execute_run(run_a.pk))
        await until(lambda: server.state.hang_started == 1)
        run_b = await post_message(agent=agent, user=world.member, content="echo")
        task_b = asyncio.create_task(execute_run(run_b.pk))
        await until(lambda: server.state.calls == 2)  # B's call is in flight on the same session
        await cancel(run_a.pk)
        await asyncio.wait_for(task_a, 10)
        await asyncio.wait_for(task_b, 20)
        assert await asyncio.to_thread(server.state.hang_cancelled.wait, 10), "the server was told to stop A's call"

    run_a, run_b = await reload_run(run_a.pk), await reload_run(run_b.pk)
    assert (run_a.status, run_b.status) == ("cancelled", "completed")
    [hang_call] = await tool_calls(run_a.pk)
    [echo_call] = await tool_calls(run_b.pk)
    assert hang_call.status == "cancelled"
    assert echo_call.status == "succeeded" and "mine" in echo_call.result
    [session] = mcp_pool().sessions
    assert session.connects == 1, "one session served both runs and survived the cancel"


async def until(predicate, *, timeout_seconds: float = 15.0) -> None:
    """Wait for an observable state (polled every 20 ms)."""
    async with asyncio.timeout(timeout_seconds):
        while not predicate():
            await asyncio.sleep(0.02)
