"""The ReAct loop against a scripted OpenAI-compatible server on real sockets."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import CutAfter, Fail, Hang, Reply, ToolCalls
from sessions.models import LLMCall, Message, ToolCall
from sessions.runner.loop import FINAL_TURN_NOTE, execute_run
from sessions.tests import tools_for_tests
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@sync_to_async
def make_agent(world, urls, *, builtins=(), tool_calls="native", **fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=urls, tool_calls=tool_calls, **fields)
    for name in builtins:
        bind_builtin(agent, name)
    return agent


@sync_to_async
def llm_calls(run_id):
    return [(c.entry_index, c.status, c.error_class) for c in LLMCall.all_tenants.filter(run_id=run_id).order_by("id")]


@sync_to_async
def tool_calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


@sync_to_async
def roles(run_id):
    return list(Message.all_tenants.filter(run_id=run_id).order_by("position").values_list("role", flat=True))


async def test_plain_answer(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(Reply("Hello there, how can I help?"))
    run = await post_message(agent=agent, user=world.member, content="Hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply, run.reason) == ("completed", "Hello there, how can I help?", "")
    assert await llm_calls(run.pk) == [(0, "succeeded", "")]
    assert await roles(run.pk) == ["user", "assistant"]
    sent = fake_llm.requests[0]["messages"]
    assert sent[0] == {"role": "system", "content": "You are a test agent."}
    assert sent[-1] == {"role": "user", "content": "Hi"}


async def test_one_tool_call_then_answer(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_echo"])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("The echo said ping."))
    run = await post_message(agent=agent, user=world.member, content="Echo ping")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed" and run.reply == "The echo said ping."
    [call] = await tool_calls(run.pk)
    assert (call.name, call.arguments, call.status, call.result) == ("test_echo", {"text": "ping"}, "succeeded", "echo: ping")
    assert call.duration_ms is not None
    assert [t["function"]["name"] for t in fake_llm.requests[0]["tools"]] == ["test_echo"]
    second = fake_llm.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "test_echo"
    assert second[-1]["role"] == "tool" and second[-1]["content"] == "echo: ping"
    assert second[-1]["tool_call_id"] == second[-2]["tool_calls"][0]["id"]
    assert await roles(run.pk) == ["user", "assistant", "tool", "assistant"]


async def test_parallel_tool_calls_run_at_once(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_sleep"], tool_max_parallel=3)
    tools_for_tests.SLEEP_WINDOWS.clear()
    fake_llm.script(ToolCalls([("test_sleep", {"seconds": 0.3})] * 3), Reply("all done"))
    run = await post_message(agent=agent, user=world.member, content="sleep thrice")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    windows = tools_for_tests.SLEEP_WINDOWS
    assert len(windows) == 3
    assert max(start for start, _ in windows) < min(end for _, end in windows), "the three sleeps overlapped"
    assert [c.status for c in await tool_calls(run.pk)] == ["succeeded"] * 3


async def test_parallelism_is_capped_by_tool_max_parallel(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_sleep"], tool_max_parallel=1)
    tools_for_tests.SLEEP_WINDOWS.clear()
    fake_llm.script(ToolCalls([("test_sleep", {"seconds": 0.1})] * 2), Reply("done"))
    run = await post_message(agent=agent, user=world.member, content="sleep twice")
    await execute_run(run.pk)
    (s1, e1), (s2, e2) = sorted(tools_for_tests.SLEEP_WINDOWS)
    assert s2 >= e1, "with tool_max_parallel=1 the second call starts after the first ends"


async def test_a_tool_that_times_out_is_reported_to_the_model(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_sleep"], tool_timeout_seconds=0.2)
    fake_llm.script(ToolCalls([("test_sleep", {"seconds": 30})]), Reply("It took too long."))
    run = await post_message(agent=agent, user=world.member, content="sleep long")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed"
    [call] = await tool_calls(run.pk)
    assert call.status == "timed_out" and "timed out after 0.2 s" in call.error
    tool_message = fake_llm.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "timed out" in tool_message["content"]


async def test_unknown_tool_and_bad_arguments_fail_the_call_not_the_run(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_echo"])
    fake_llm.script(ToolCalls([("no_such_tool", {}), ("test_echo", {"wrong": 1})]), Reply("ok"))
    run = await post_message(agent=agent, user=world.member, content="x")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    unknown, bad = await tool_calls(run.pk)
    assert unknown.status == "failed" and "Unknown tool 'no_such_tool'" in unknown.error and "test_echo" in unknown.error
    assert bad.status == "failed" and "`text` is required" in bad.error
    contents = [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert all(c.startswith("Error: ") for c in contents)


async def test_max_loop_count_withholds_tools_on_the_last_turn(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_echo"], max_loop_count=2)
    fake_llm.script(ToolCalls([("test_echo", {"text": "1"})]), Reply("Final answer without tools."))
    run = await post_message(agent=agent, user=world.member, content="loop")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed" and run.reply == "Final answer without tools." and run.loop_count == 2
    last_request = fake_llm.requests[1]
    assert not last_request.get("tools")
    assert last_request["messages"][-1] == {"role": "user", "content": FINAL_TURN_NOTE}


async def test_max_loop_count_reached_without_an_answer_fails_the_run(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_echo"], max_loop_count=2)
    fake_llm.script(ToolCalls([("test_echo", {"text": "1"})]), ToolCalls([("test_echo", {"text": "2"})]))
    run = await post_message(agent=agent, user=world.member, content="loop forever")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "max_loop_count")
    assert "limit of 2 model turns" in run.error
    assert len(await tool_calls(run.pk)) == 1, "calls written on the tool-less last turn are not executed"


@pytest.mark.parametrize(
    "failure, error_class",
    [
        (Fail(500, body={"error": {"message": "internal"}}), "server"),
        (Fail(429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "0"}), "rate_limit"),
        (Hang(30), "timeout"),
    ],
    ids=["http500", "http429", "hang"],
)
async def test_fallback_to_the_second_entry_before_the_first_token(world, fake_llm, second_fake_llm, failure, error_class):
    agent = await make_agent(world, [fake_llm.base_url, second_fake_llm.base_url], read_timeout_seconds=0.5)
    fake_llm.script(failure)
    second_fake_llm.script(Reply("from the fallback"))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "from the fallback")
    calls = await llm_calls(run.pk)
    assert [c[:2] for c in calls] == [(0, "failed"), (1, "succeeded")]
    assert calls[0][2] == error_class


async def test_fallback_when_the_first_provider_refuses_connections(world, second_fake_llm):
    from conftest import free_port

    agent = await make_agent(world, [f"http://127.0.0.1:{free_port()}/v1", second_fake_llm.base_url])
    second_fake_llm.script(Reply("fallback"))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).reply == "fallback"
    assert [c[:2] for c in await llm_calls(run.pk)] == [(0, "failed"), (1, "succeeded")]


async def test_no_fallback_after_the_first_token(world, fake_llm, second_fake_llm):
    agent = await make_agent(world, [fake_llm.base_url, second_fake_llm.base_url])
    broken = CutAfter("This answer will break off somewhere in the middle", 3)
    fake_llm.script(broken, broken)  # the turn is retried once, on the same entry
    second_fake_llm.script(Reply("must not be used"))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "stream_interrupted")
    assert len(fake_llm.requests) == 2
    assert second_fake_llm.requests == []
    assert await roles(run.pk) == ["user"], "nothing half-streamed is written to the transcript"


async def test_every_entry_failing_fails_the_run_with_a_reason(world, fake_llm, second_fake_llm):
    agent = await make_agent(world, [fake_llm.base_url, second_fake_llm.base_url])
    fake_llm.script(Fail(503, body={"error": {"message": "overloaded"}}))
    second_fake_llm.script(Fail(500, body={"error": {"message": "down"}}))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "model_unavailable")
    assert [c[:2] for c in await llm_calls(run.pk)] == [(0, "failed"), (1, "failed")]


async def test_text_mode_tool_calls_are_parsed_from_the_answer(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], builtins=["test_echo"], tool_calls="text")
    fake_llm.script(
        Reply('```json\n{"name": "test_echo", "arguments": {"text": "from text"}}\n```'),
        Reply("The tool echoed: from text"),
    )
    run = await post_message(agent=agent, user=world.member, content="echo it")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed" and run.reply == "The tool echoed: from text"
    [call] = await tool_calls(run.pk)
    assert (call.name, call.arguments, call.status) == ("test_echo", {"text": "from text"}, "succeeded")
    first = fake_llm.requests[0]
    assert "tools" not in first or not first["tools"]
    assert "test_echo" in first["messages"][0]["content"], "tools are described in the system prompt"
    assert "echo: from text" in json.dumps(fake_llm.requests[1]["messages"])


async def test_second_message_sees_the_first_runs_history(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(Reply("first answer"), Reply("second answer"))
    run1 = await post_message(agent=agent, user=world.member, content="first question")
    await execute_run(run1.pk)
    session = (await reload_run(run1.pk)).session_id
    from sessions.models import ChatSession

    session_obj = await sync_to_async(ChatSession.all_tenants.get)(pk=session)
    run2 = await post_message(agent=agent, user=world.member, content="second question", session=session_obj)
    await execute_run(run2.pk)
    sent = [(m["role"], m["content"]) for m in fake_llm.requests[1]["messages"][1:]]
    assert sent == [("user", "first question"), ("assistant", "first answer"), ("user", "second question")]


async def test_a_broken_stream_is_retried_once_from_the_persisted_state(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(CutAfter("This answer will break off somewhere", 3), Reply("A complete answer."))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "A complete answer.")
    assert await roles(run.pk) == ["user", "assistant"], "the broken answer is not in the transcript"
    assert fake_llm.requests[0]["messages"] == fake_llm.requests[1]["messages"]


async def test_a_shared_cooldown_skips_a_failing_entry_on_the_next_run(world, fake_llm, second_fake_llm):
    agent = await make_agent(world, [fake_llm.base_url, second_fake_llm.base_url])
    fake_llm.script(Fail(401, body={"error": {"message": "bad key"}}))  # auth: opens the breaker at once
    second_fake_llm.script(Reply("fallback one"), Reply("fallback two"))
    first = await post_message(agent=agent, user=world.member, content="one")
    await execute_run(first.pk)
    second = await post_message(agent=agent, user=world.member, content="two")
    await execute_run(second.pk)
    assert (await reload_run(second.pk)).reply == "fallback two"
    assert len(fake_llm.requests) == 1, "the entry in cooldown was not called again"
    assert [c[:2] for c in await llm_calls(second.pk)] == [(1, "succeeded")]


async def test_a_run_is_enqueued_with_its_tenant_and_a_wrong_tenant_finds_no_run(
    world, other_world, fake_llm, monkeypatch,
):
    """The task carries the run's tenant (one lookup less per run); a wrong one is harmless:
    the claim reads the run in that tenant only."""
    sent = []
    monkeypatch.setattr("sessions.tasks.run_enqueue", lambda run_id, tenant_id=None: sent.append((run_id, tenant_id)))
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(Reply("Hello."))
    run = await post_message(agent=agent, user=world.member, content="Hi")
    assert sent == [(run.pk, world.tenant.pk)]

    await execute_run(run.pk, tenant_id=other_world.tenant.pk)
    assert (await reload_run(run.pk)).status == "queued" and fake_llm.requests == []

    await execute_run(run.pk, tenant_id=world.tenant.pk)
    assert (await reload_run(run.pk)).status == "completed"
