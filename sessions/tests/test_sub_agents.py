"""Sub-agents (capability kind ``agent``) end to end on the scripted model: agent B called by
agent A's run as a tool runs as a child run with B's prompt, route and tools; the depth limit;
A's budget; an approval inside B pausing the whole tree; the trace's tree; and a handoff (B takes
the chat over). Binding rules (cycles, tenants): ``capabilities/tests/test_agent_kind.py``."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route, bind_builtin
from llm.models import ModelRouteEntry
from llm.testing import Reply, ToolCalls
from sessions.events import events_since
from sessions.models import ChatSession, Message, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run
from sessions.trace_selectors import run_trace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _agents_sync(world, url, *, handoff=False, a_fields=None, b_builtins=("test_echo",), b_policy=()):
    """A (no tools of its own) with B bound as a tool; B on its own route (model ``b-model``) with ``b_builtins``."""
    a = agent_with_route(tenant=world.tenant, base_urls=[url], read_timeout_seconds=30.0, name="Alpha",
                         system_prompt="You are Alpha.", **(a_fields or {}))
    b = agent_with_route(tenant=world.tenant, base_urls=[url], read_timeout_seconds=30.0, name="Beta", slug="beta",
                         system_prompt="You are Beta.", description="Beta knows things.")
    ModelRouteEntry.all_tenants.filter(route=b.route).update(model="b-model")
    for name in b_builtins:
        bind_builtin(b, name, approval_policy=list(b_policy))
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=a, kind="agent",
                                         config={"agent": b.pk, "handoff": handoff})
    return a, b


_agents = sync_to_async(_agents_sync)


def tool_names(request):
    return sorted(t["function"]["name"] for t in request.get("tools") or [])


@sync_to_async
def _sub_runs(run_id):
    return list(Run.all_tenants.filter(parent_tool_call__run_id=run_id).select_related("agent_version").order_by("id"))


@sync_to_async
def _calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


@pytest.mark.usefixtures("no_enqueue")
async def test_a_bound_agent_runs_as_a_child_run_with_its_own_prompt_route_and_tools(world, fake_llm):
    a, b = await _agents(world, fake_llm.base_url)
    fake_llm.script(
        ToolCalls([("beta", {"task": "Echo hi"})]),  # A, turn 0
        ToolCalls([("test_echo", {"text": "hi"})]),  # B, turn 0
        Reply("Beta says hi."),  # B, turn 1
        Reply("Alpha relays: Beta says hi."),  # A, turn 1
    )
    run = await post_message(agent=a, user=world.member, content="Ask Beta")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "Alpha relays: Beta says hi.")

    a0, b0, b1, a1 = fake_llm.requests
    assert tool_names(a0) == ["beta"] and tool_names(b0) == ["test_echo"]  # B's own tools, not A's
    [spec] = [t["function"] for t in a0["tools"]]
    assert spec["description"] == "Beta knows things." and spec["parameters"]["required"] == ["task"]
    assert (a0["model"], b0["model"], b1["model"], a1["model"]) == ("model-0", "b-model", "b-model", "model-0")
    assert b0["messages"] == [{"role": "system", "content": "You are Beta."}, {"role": "user", "content": "Echo hi"}]
    assert "Beta says hi." in str(a1["messages"][-1]["content"])

    [sub] = await _sub_runs(run.pk)
    [call] = await _calls(run.pk)
    b_version = await sync_to_async(lambda: type(b).all_tenants.get(pk=b.pk).draft_version_id)()
    assert (sub.depth, sub.status, sub.reply, sub.agent_version_id, sub.skill_id) == (
        1, "completed", "Beta says hi.", b_version, None)
    assert (call.status, call.result, call.result_data["sub_run_id"]) == ("succeeded", "Beta says hi.", sub.pk)
    [echo] = await _calls(sub.pk)
    assert (echo.name, echo.result) == ("test_echo", "echo: hi")
    assert run.prompt_tokens > sub.prompt_tokens > 0  # B's usage is added to A's run

    frames = await events_since(session_id=run.session_id, after_seq=0)
    [running] = [f["data"] for f in frames if f["run_id"] == sub.pk and f["type"] == "run_running"]
    assert (running["agent"], running["depth"], running["task"], running["parent_run_id"]) == ("Beta", 1, "Echo hi", run.pk)

    # The trace shows the tree: A's call names the agent and links B's run.
    trace = await sync_to_async(run_trace)(run=run, admin=True)
    [tc] = [t for turn in trace["turns"] for t in turn["tool_calls"]]
    assert (tc["sub_run"]["agent"], tc["sub_run"]["id"]) == ("Beta", sub.pk)
    sub_trace = await sync_to_async(run_trace)(run=sub, admin=True)
    assert (sub_trace["run"]["parent_run_id"], sub_trace["run"]["depth"]) == (run.pk, 1)


@pytest.mark.usefixtures("no_enqueue")
async def test_sub_agents_stop_at_the_depth_limit(world, fake_llm, settings):
    settings.SUB_AGENT_MAX_DEPTH = 1
    a, b = await _agents(world, fake_llm.base_url)
    c = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Gamma")
    await sync_to_async(CapabilityBinding.all_tenants.create)(tenant=world.tenant, agent=b, kind="agent",
                                                              config={"agent": c.pk})
    fake_llm.script(
        ToolCalls([("beta", {"task": "go deeper"})]),  # A
        ToolCalls([("gamma", {"task": "deeper still"})]),  # B at depth 1: Gamma may not run
        Reply("I could not ask Gamma."),  # B
        Reply("done"),  # A
    )
    run = await post_message(agent=a, user=world.member, content="Go")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).reply == "done"
    [sub] = await _sub_runs(run.pk)
    assert await _sub_runs(sub.pk) == []
    [too_deep] = await _calls(sub.pk)
    assert too_deep.status == "failed" and "at most 1 levels deep" in too_deep.error


@pytest.mark.usefixtures("no_enqueue")
async def test_a_sub_agent_spends_from_the_calling_runs_budget(world, fake_llm):
    a, b = await _agents(world, fake_llm.base_url, a_fields={"max_tokens_per_run": 5000})
    fake_llm.script(ToolCalls([("beta", {"task": "t"})], usage=(4990, 5)))  # A has used 4995 of 5000 tokens
    run = await post_message(agent=a, user=world.member, content="go")
    await execute_run(run.pk)
    [sub] = await _sub_runs(run.pk)
    assert (sub.status, sub.reason) == ("failed", "budget_exceeded")  # B has no budget of its own: A's applies
    assert len(fake_llm.requests) == 1


def test_an_approval_inside_a_sub_agent_pauses_the_tree_for_the_same_person(world, fake_llm, no_enqueue):
    from sessions.tests.conftest import post_message_sync

    a, b = _agents_sync(world, fake_llm.base_url, b_policy=[{"pattern": "test_echo", "action": "ask"}])
    fake_llm.script(
        ToolCalls([("beta", {"task": "echo x"})]),  # A
        ToolCalls([("test_echo", {"text": "x"})]),  # B: its policy asks a human
    )
    run = post_message_sync(agent=a, user=world.member, content="go")
    no_enqueue.clear()
    asyncio.run(execute_run(run.pk))
    run.refresh_from_db()
    [sub] = list(Run.all_tenants.filter(parent_tool_call__run_id=run.pk))
    assert (run.status, sub.status) == ("awaiting_approval", "awaiting_approval")
    # The member who asked A sees B's approval and decides it.
    client = world.client()
    [listed] = client.get("/api/v1/approvals/").json()
    assert (listed["run"], listed["sub_run"]) == (run.pk, sub.pk)
    assert client.post(f"/api/v1/approvals/{listed['id']}/", {"decision": "approve"}, format="json").status_code == 200
    assert no_enqueue == [run.pk]
    fake_llm.script(Reply("echoed"), Reply("all done"))  # B, then A
    asyncio.run(execute_run(run.pk))
    run.refresh_from_db()
    sub.refresh_from_db()
    assert (run.status, run.reply, sub.status, sub.reply) == ("completed", "all done", "completed", "echoed")
    [echo] = list(ToolCall.all_tenants.filter(run=sub))
    assert (echo.status, echo.result) == ("succeeded", "echo: x")


@pytest.mark.usefixtures("no_enqueue")
async def test_a_handoff_gives_the_chat_to_the_other_agent(world, fake_llm):
    a, b = await _agents(world, fake_llm.base_url, handoff=True, b_builtins=())
    fake_llm.script(
        ToolCalls([("transfer_to_beta", {"task": "The user wants Beta"})]),  # A
        Reply("Beta here, how can I help?"),  # B answers this run
    )
    run = await post_message(agent=a, user=world.member, content="I need Beta")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "Beta here, how can I help?")
    assert len(fake_llm.requests) == 2  # no further turn of A's model
    assert fake_llm.requests[0]["tools"][0]["function"]["description"].startswith("Hand the conversation over")
    session = await sync_to_async(ChatSession.all_tenants.get)(pk=run.session_id)
    assert session.agent_id == b.pk
    frames = await events_since(session_id=run.session_id, after_seq=0)
    [handoff] = [f for f in frames if f["type"] == "agent_handoff"]
    assert handoff["run_id"] == run.pk
    assert handoff["data"] == {"from_agent": "Alpha", "to_agent": "Beta", "to_agent_id": b.pk}
    roles = await sync_to_async(lambda: [(m.role, m.content) for m in Message.all_tenants.filter(run=run)
                                         .order_by("position")])()
    assert [r for r, _ in roles] == ["user", "assistant", "tool", "assistant"]
    assert roles[-1][1] == "Beta here, how can I help?"

    # The chat's later messages run Beta, with the conversation so far.
    fake_llm.script(Reply("Still Beta."))
    second = await post_message(agent=b, user=world.member, content="Thanks", session=session)
    await execute_run(second.pk)
    request = fake_llm.requests[-1]
    assert request["model"] == "b-model" and request["messages"][0]["content"] == "You are Beta."
    assert [m.get("content") for m in request["messages"]][-2:] == ["Beta here, how can I help?", "Thanks"]


@pytest.mark.usefixtures("no_enqueue")
async def test_a_handoffs_reply_passes_the_calling_agents_output_guardrails(world, fake_llm):
    """B's reply becomes A's run's answer: A's output guardrails check it as they check an
    answer of A's own model; a trip fails A's run and the chat stays with A."""
    from guardrails.models import Guardrail

    a, b = await _agents(world, fake_llm.base_url, handoff=True, b_builtins=())
    await sync_to_async(Guardrail.all_tenants.create)(
        tenant=world.tenant, agent=a, name="No cards", point="output", kind="pii", config={"types": ["card"]},
        message="I cannot share card numbers.")
    fake_llm.script(ToolCalls([("transfer_to_beta", {"task": "card?"})]), Reply("Your card is 4111 1111 1111 1111."))
    run = await post_message(agent=a, user=world.member, content="What is my card?")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason, run.reply) == ("failed", "guardrail_tripped", "")
    assert "card numbers" in run.error
    session = await sync_to_async(ChatSession.all_tenants.get)(pk=run.session_id)
    assert session.agent_id == a.pk
    frames = await events_since(session_id=run.session_id, after_seq=0)
    assert not [f for f in frames if f["type"] == "agent_handoff"]
    [tripped] = [f for f in frames if f["type"] == "guardrail_tripped"]
    assert tripped["data"]["guardrail"] == "No cards"


def test_a_handoff_whose_agent_waits_for_an_approval_hands_over_when_resumed(world, fake_llm, no_enqueue):
    from sessions.tests.conftest import post_message_sync

    a, b = _agents_sync(world, fake_llm.base_url, handoff=True, b_policy=[{"pattern": "test_echo", "action": "ask"}])
    fake_llm.script(ToolCalls([("transfer_to_beta", {"task": "echo x"})]), ToolCalls([("test_echo", {"text": "x"})]))
    run = post_message_sync(agent=a, user=world.member, content="go")
    asyncio.run(execute_run(run.pk))
    run.refresh_from_db()
    assert run.status == "awaiting_approval" and ChatSession.all_tenants.get(pk=run.session_id).agent_id == a.pk
    [listed] = world.client().get("/api/v1/approvals/").json()
    assert world.client().post(f"/api/v1/approvals/{listed['id']}/", {"decision": "approve"},
                               format="json").status_code == 200
    fake_llm.script(Reply("Beta has echoed."))  # B only: the resumed handoff call ends A's run
    asyncio.run(execute_run(run.pk))
    run.refresh_from_db()
    assert (run.status, run.reply) == ("completed", "Beta has echoed.")
    assert len(fake_llm.requests) == 3
    assert ChatSession.all_tenants.get(pk=run.session_id).agent_id == b.pk


@pytest.mark.usefixtures("no_enqueue")
async def test_cancelling_the_calling_run_cancels_the_sub_agents_run(world, fake_llm):
    from sessions.tests.test_subruns import _cancel, _wait_for_sub_tool

    a, b = await _agents(world, fake_llm.base_url, b_builtins=("test_sleep",))
    fake_llm.script(ToolCalls([("beta", {"task": "wait"})]), ToolCalls([("test_sleep", {"seconds": 30})]))
    run = await post_message(agent=a, user=world.member, content="go")
    task = asyncio.create_task(execute_run(run.pk))
    sub = await _wait_for_sub_tool(run.pk, "test_sleep")  # B's own tool, running in B's run
    await sync_to_async(lambda: _cancel(run.pk))()
    await asyncio.wait_for(task, timeout=10)
    assert (await reload_run(run.pk)).status == "cancelled"
    assert (await reload_run(sub.pk)).status == "cancelled"
    [sleep_call] = await _calls(sub.pk)
    assert sleep_call.status == "cancelled"
