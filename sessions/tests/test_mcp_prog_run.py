"""MCP log messages, sampling and cancellation through a run (issue 37), on the fake model and
:mod:`capabilities.tests.prog_test_server`: a server's sampling request runs through the
agent's route (an LLM call of purpose ``sampling`` with the run and turn, counted in the run's
usage), its log messages land on the tool call (the trace shows them), and cancelling a run
sends ``notifications/cancelled`` for each of its calls in flight."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from channels.db import database_sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.mcp.pool import mcp_pool
from capabilities.services import mcp_server_save
from capabilities.tests.confined_servers import until
from capabilities.tests.prog_test_server import serve_prog
from llm.testing import Reply, ToolCalls
from sessions.models import LLMCall, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message
from sessions.tests.test_cancellation import cancel
from sessions.trace_selectors import run_trace

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture
async def prog():
    with serve_prog() as served:
        yield served
        await mcp_pool().aclose()  # before the server stops: an open session would hold its shutdown


@database_sync_to_async
def _agent(world, llm_url, server_url, config):
    agent = agent_with_route(tenant=world.tenant, base_urls=[llm_url])
    server = mcp_server_save(tenant=world.tenant, env=None, name="prog", alias="prog",
                             transport="streamable_http", url=server_url)
    binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server,
                                config=config)
    binding.full_clean()
    binding.save()
    return agent


@database_sync_to_async
def _rows(run_id):
    run = Run.all_tenants.get(pk=run_id)
    calls = list(LLMCall.all_tenants.filter(run_id=run_id).order_by("id"))
    tools = list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))
    return run, calls, tools, run_trace(run=run, admin=False)


async def test_sampling_runs_through_the_route_and_logs_reach_the_trace(world, fake_llm, prog):
    url, state = prog
    agent = await _agent(world, fake_llm.base_url, url, {"log_level": "info", "sampling": {"allowed": True}})
    fake_llm.script(ToolCalls([("prog__summarize", {"text": "a long text"})]), Reply("Short."),
                    ToolCalls([("prog__chatty", {})]), Reply("Done."))
    run = await post_message(agent=agent, user=world.member, content="Summarize, then chat")
    await execute_run(run.pk)
    run, calls, [summarize, chatty], trace = await _rows(run.pk)
    assert run.status == "completed", run.error
    assert "summary: Short." in summarize.result, (summarize.status, summarize.error, [(c.purpose, c.status, c.error) for c in calls])
    assert [(c.purpose, c.turn) for c in calls] == [("turn", 0), ("sampling", 0), ("turn", 1), ("turn", 2)]
    assert run.prompt_tokens == sum(c.prompt_tokens for c in calls)  # the run's usage (and budget) counts it
    sampled = fake_llm.requests[1]["messages"]
    assert sampled[0] == {"role": "system", "content": "You write one-line summaries."}
    assert sampled[-1]["content"] == "Summarize: a long text" and len(state.samples) == 1
    [turn0, turn1, _] = trace["turns"]
    assert [a["purpose"] for a in turn0["attempts"]] == ["turn"]
    assert [a["purpose"] for a in turn0["sampling_calls"]] == ["sampling"] and trace["totals"]["sampling_calls"] == 1
    assert [(e["level"], e["logger"]) for e in chatty.server_log] == [("info", "chatty"), ("warning", "chatty"),
                                                                      ("error", "chatty")]
    assert [e["data"] for e in turn1["tool_calls"][0]["server_log"]] == ["i", "w", {"code": 7, "why": "x"}]


async def test_cancelling_a_run_sends_notifications_cancelled_for_each_call_in_flight(world, fake_llm, prog,
                                                                                        monkeypatch):
    """Protocol 2025-11-25 (on 2026-07-28 the SDK ends each call's HTTP request instead)."""
    from capabilities import services

    config = services.mcp_server_config
    monkeypatch.setattr(services, "mcp_server_config",
                        lambda **kw: dataclasses.replace(config(**kw), protocol_mode="legacy"))
    url, state = prog
    agent = await _agent(world, fake_llm.base_url, url, {})
    fake_llm.script(ToolCalls([("prog__block", {}), ("prog__block", {})]))
    run = await post_message(agent=agent, user=world.member, content="Block twice")
    task = asyncio.create_task(execute_run(run.pk))
    await until(lambda: state.blocked == 2)
    await cancel(run.pk)
    await asyncio.wait_for(task, 10)
    await until(lambda: len(state.cancelled) == 2)
    run, _, tools, _ = await _rows(run.pk)
    assert run.status == "cancelled" and [t.status for t in tools] == ["cancelled", "cancelled"]
    assert len(set(state.cancelled)) == 2

