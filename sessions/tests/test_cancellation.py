"""Cancelling runs: while streaming, during a slow tool, while queued, through the API and a
real Celery worker. The model is a FakeLLMServer on a real socket."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Hang, Reply, ToolCalls
from sessions.events import events_since, events_since_sync
from sessions.models import Message, Run, ToolCall
from sessions.runner.cancellation import CANCEL_ERROR, CANCEL_REASON
from sessions.runner.loop import execute_run
from sessions.services import run_cancel
from sessions.tests.conftest import post_message, post_message_sync, reload_run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

CANCEL_LATENCY_LIMIT_SECONDS = 1.0
LATENCIES: dict[str, float] = {}
"""Measured cancel latencies (seconds from the cancel call to the run's end), for the report."""


@sync_to_async
def make_agent(world, urls, *, builtins=(), **fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=urls, read_timeout_seconds=60.0, **fields)
    for name in builtins:
        bind_builtin(agent, name)
    return agent


@sync_to_async
def cancel(run_id: int) -> Run:
    run = Run.all_tenants.get(pk=run_id)
    with tenant_scope(run.tenant_id):
        return run_cancel(run=run)


async def wait_for_event(session_id: int, event_type: str, *, timeout_seconds: float = 5.0) -> dict:
    """The first ``event_type`` frame of the session's replay stream (polled, bounded)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        for frame in await events_since(session_id=session_id, after_seq=0):
            if frame["type"] == event_type:
                return frame
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {event_type} event in session {session_id} after {timeout_seconds} s")


async def cancel_and_measure(task: asyncio.Task, run_id: int) -> float:
    started = time.monotonic()
    await cancel(run_id)
    await asyncio.wait_for(task, timeout=10)
    return time.monotonic() - started


@pytest.mark.usefixtures("no_enqueue")
async def test_cancel_while_streaming_stops_the_stream(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(Reply("lorem ipsum " * 200, chunk_size=2, chunk_interval_seconds=0.05))
    run = await post_message(agent=agent, user=world.member, content="Write a lot")
    task = asyncio.create_task(execute_run(run.pk))
    assert await fake_llm.await_requests(1)
    await wait_for_event(run.session_id, "content_token")

    latency = await cancel_and_measure(task, run.pk)
    LATENCIES["streaming"] = latency

    assert latency < CANCEL_LATENCY_LIMIT_SECONDS, f"cancel took {latency:.3f} s"
    run = await reload_run(run.pk)
    assert (run.status, run.error, run.reason) == ("cancelled", CANCEL_ERROR, "")
    assert run.finished_at is not None
    # The text streamed before the stop stays as the run's reply (the chat shows it, marked stopped).
    streamed = "".join(f["data"]["text"] for f in await events_since(session_id=run.session_id, after_seq=0)
                       if f["type"] == "content_token" and f["run_id"] == run.pk)
    assert run.reply and ("lorem ipsum " * 200).startswith(run.reply)
    assert run.reply.startswith(streamed), "at least what the client saw is kept"
    roles = await sync_to_async(lambda: list(Message.all_tenants.filter(run_id=run.pk).values_list("role", flat=True)))()
    assert roles == ["user"], "no assistant message is persisted for a cancelled stream"
    assert await fake_llm.await_disconnects(1), "the HTTP stream to the model was closed"
    types = [f["type"] for f in await events_since(session_id=run.session_id, after_seq=0)]
    assert types[-1] == "run_cancelled" and "run_failed" not in types and "run_completed" not in types
    [frame] = [f for f in await events_since(session_id=run.session_id, after_seq=0) if f["type"] == "run_cancelled"]
    assert frame["data"] == {"reason": CANCEL_REASON}


@pytest.mark.usefixtures("no_enqueue")
async def test_cancel_during_a_slow_tool_cancels_the_tool_call(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_sleep"])
    fake_llm.script(ToolCalls([("test_sleep", {"seconds": 30})]), Reply("never reached"))
    run = await post_message(agent=agent, user=world.member, content="sleep long")
    task = asyncio.create_task(execute_run(run.pk))
    await wait_for_event(run.session_id, "tool_call_started")

    latency = await cancel_and_measure(task, run.pk)
    LATENCIES["tool"] = latency

    assert latency < CANCEL_LATENCY_LIMIT_SECONDS, f"cancel took {latency:.3f} s"
    run = await reload_run(run.pk)
    assert (run.status, run.error, run.reason) == ("cancelled", CANCEL_ERROR, "")
    [call] = await sync_to_async(lambda: list(ToolCall.all_tenants.filter(run_id=run.pk)))()
    assert (call.name, call.status) == ("test_sleep", "cancelled") and call.finished_at is not None
    assert len(fake_llm.requests) == 1, "the model is not asked again after the cancel"


def mcp_time_server_pids() -> list[int]:
    """Pids of this process's children running mcp_server_time (read from /proc)."""
    me = str(os.getpid())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if parent == me and b"mcp_server_time" in cmdline:
            pids.append(int(entry))
    return pids


@pytest.mark.usefixtures("no_enqueue")
async def test_cancel_leaves_the_pooled_mcp_session_to_other_runs(world, fake_llm):
    """A cancelled run releases its MCP sessions; the pool keeps them (the server process lives
    on for the next run) until the pool closes them."""
    from capabilities.mcp.pool import mcp_pool
    from sessions.tests.test_runner_mcp import agent_with_time_server

    # Other tests' runs on the worker's run-host loop may have pooled servers of their own.
    elsewhere = set(mcp_time_server_pids())
    agent = await agent_with_time_server(world, fake_llm.base_url)
    fake_llm.script(Hang(60))
    run = await post_message(agent=agent, user=world.member, content="time?")
    task = asyncio.create_task(execute_run(run.pk))
    assert await fake_llm.await_requests(1, timeout_seconds=30)
    pids = set(mcp_time_server_pids()) - elsewhere
    assert pids, "the MCP server is running while the model is asked"

    latency = await cancel_and_measure(task, run.pk)
    LATENCIES["mcp"] = latency

    assert (await reload_run(run.pk)).status == "cancelled"
    assert pids <= set(mcp_time_server_pids()), "the pooled stdio server outlives the cancelled run"
    assert latency < CANCEL_LATENCY_LIMIT_SECONDS, f"cancel took {latency:.3f} s"
    await mcp_pool().aclose()
    assert not pids & set(mcp_time_server_pids()), "closing the pool terminates the stdio server"


@pytest.mark.usefixtures("no_enqueue")
async def test_a_run_that_finished_is_not_touched_by_a_late_cancel_signal(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(Reply("done"))
    run = await post_message(agent=agent, user=world.member, content="Hi")
    await execute_run(run.pk)
    leftovers = [t.get_name() for t in asyncio.all_tasks() if "cancel" in t.get_name()]
    assert leftovers == [], "the cancel watcher stops with the run"
    with pytest.raises(Exception, match="already finished"):
        await cancel(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "done")


def test_cancel_a_queued_run_via_the_api(world, fake_llm, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.script(Reply("should never be asked"))
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    posted = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "hi"}, format="json").json()
    run_id = posted["run"]["id"]

    resp = client.post(f"/api/v1/runs/{run_id}/cancel/")

    assert resp.status_code == 200
    body = resp.json()
    assert (body["id"], body["status"], body["error"], body["reason"]) == (run_id, "cancelled", CANCEL_ERROR, "")
    asyncio.run(execute_run(run_id))  # the worker that picks the queued task up does nothing
    run = Run.all_tenants.get(pk=run_id)
    assert (run.status, run.attempt, run.started_at) == ("cancelled", 0, None)
    assert fake_llm.requests == []
    types = [f["type"] for f in events_since_sync(session_id=session["id"], after_seq=0)]
    assert types == ["run_queued", "run_cancelled"]
    assert client.post(f"/api/v1/runs/{run_id}/cancel/").status_code == 409


def test_cancelling_a_queued_run_starts_the_next_queued_one(world, fake_llm, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    first = post_message_sync(agent=agent, user=world.member, content="one")
    with tenant_scope(world.tenant.pk):
        second = post_message_sync(agent=agent, user=world.member, content="two", session=first.session)
    no_enqueue.clear()
    with tenant_scope(world.tenant.pk):
        run_cancel(run=first)
    assert no_enqueue == [second.pk]


def test_cancel_api_404_for_missing_or_foreign_runs_409_when_finished(world, other_world, fake_llm, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")

    foreign = other_world.client().post(f"/api/v1/runs/{run.pk}/cancel/")
    missing = world.client().post(f"/api/v1/runs/{run.pk + 1000}/cancel/")
    assert foreign.status_code == 404 and missing.status_code == 404
    assert foreign.json() == missing.json() == {"message": "Run not found.", "extra": {}}
    assert Run.all_tenants.get(pk=run.pk).status == "queued"

    Run.all_tenants.filter(pk=run.pk).update(status="completed", reply="done")
    resp = world.client().post(f"/api/v1/runs/{run.pk}/cancel/")
    assert resp.status_code == 409
    assert resp.json() == {"message": "The run has already finished.", "extra": {}}
    assert Run.all_tenants.get(pk=run.pk).status == "completed"


def test_cancel_a_running_run_through_a_celery_worker(world, fake_llm, celery_worker):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], read_timeout_seconds=60.0)
    fake_llm.script(Hang(60))
    client = world.client()
    session = client.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()
    run_id = client.post(f"/api/v1/sessions/{session['id']}/messages/", {"content": "hang"}, format="json").json()["run"]["id"]
    assert fake_llm.wait_for_requests(1, timeout_seconds=30), "the worker asked the model"

    started = time.monotonic()
    resp = client.post(f"/api/v1/runs/{run_id}/cancel/")
    assert resp.status_code == 202 and resp.json()["status"] == "running"
    deadline = time.monotonic() + 10
    while (body := client.get(f"/api/v1/runs/{run_id}/").json())["status"] == "running":
        assert time.monotonic() < deadline, "the run is still running 10 s after the cancel"
        time.sleep(0.02)
    LATENCIES["celery"] = time.monotonic() - started

    assert (body["status"], body["error"], body["reason"]) == ("cancelled", CANCEL_ERROR, "")
    assert LATENCIES["celery"] < CANCEL_LATENCY_LIMIT_SECONDS, f"cancel took {LATENCIES['celery']:.3f} s"
    assert fake_llm.wait_for_disconnects(1), "the hanging request was abandoned"
    frames = events_since_sync(session_id=session["id"], after_seq=0)
    assert [f["type"] for f in frames if f["type"].startswith("run_")] == ["run_queued", "run_running", "run_cancelled"]
    assert frames[-1]["data"] == {"reason": CANCEL_REASON}


def teardown_module(module) -> None:
    if LATENCIES:
        print("\ncancel latencies (s): " + ", ".join(f"{k}={v:.3f}" for k, v in LATENCIES.items()))
