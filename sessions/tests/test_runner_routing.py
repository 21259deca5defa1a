"""Routing seen from a run: turn timeout, reasoning, and a fallback across providers mid-run."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.models import ModelProvider
from llm.testing import Fail, Hang, Reply, ToolCalls
from llm.testing_anthropic import FakeAnthropicServer
from sessions.models import LLMCall, Message
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@database_sync_to_async
def make_agent(world, urls, **fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=urls, **fields)
    bind_builtin(agent, "test_echo")
    return agent


async def test_a_turn_longer_than_the_agents_turn_timeout_fails_the_run(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], read_timeout_seconds=30.0, turn_timeout_seconds=1.0)
    fake_llm.script(Hang(30))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "turn_timeout")
    assert "turn timeout of 1 s" in run.error


async def test_reasoning_is_recorded_and_never_sent_back(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(
        Reply("First answer.", reasoning="Let me think about the first question."),
        Reply("Second answer."),
    )
    run = await post_message(agent=agent, user=world.member, content="one")
    await execute_run(run.pk)
    stored = await database_sync_to_async(
        lambda: Message.all_tenants.get(run_id=run.pk, role="assistant").reasoning
    )()
    assert stored == "Let me think about the first question."
    assert (await reload_run(run.pk)).reply == "First answer."
    session = await database_sync_to_async(lambda: run.session)()
    second = await post_message(agent=agent, user=world.member, content="two", session=session)
    await execute_run(second.pk)
    assert "think about" not in json.dumps(fake_llm.requests[1])


async def test_fallback_from_openai_compatible_to_anthropic_in_a_run_with_tool_calls(world, fake_llm):
    with FakeAnthropicServer() as anthropic:
        agent = await make_agent(world, [fake_llm.base_url, anthropic.base_url])

        @database_sync_to_async
        def make_second_provider_anthropic():
            ModelProvider.all_tenants.filter(entries__route=agent.route, entries__position=1).update(api="anthropic")

        await make_second_provider_anthropic()
        fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Fail(500, body={"error": {"message": "down"}}))
        anthropic.script(Reply("The echo said ping (answered by the fallback)."))
        run = await post_message(agent=agent, user=world.member, content="echo ping")
        await execute_run(run.pk)
        run = await reload_run(run.pk)
        assert (run.status, run.reply) == ("completed", "The echo said ping (answered by the fallback).")

        sent = anthropic.requests[0]
        assert sent["system"] == "You are a test agent."
        roles = [(m["role"], [b["type"] for b in m["content"]]) for m in sent["messages"]]
        assert roles == [("user", ["text"]), ("assistant", ["tool_use"]), ("user", ["tool_result"])]
        tool_use = sent["messages"][1]["content"][0]
        tool_result = sent["messages"][2]["content"][0]
        assert (tool_use["name"], tool_use["input"]) == ("test_echo", {"text": "ping"})
        assert tool_result["tool_use_id"] == tool_use["id"]
        assert "echo: ping" in json.dumps(tool_result["content"])
        calls = await database_sync_to_async(
            lambda: [(c.turn, c.entry_index, c.status) for c in LLMCall.all_tenants.filter(run_id=run.pk).order_by("id")]
        )()
        assert calls == [(0, 0, "succeeded"), (1, 0, "failed"), (1, 1, "succeeded")]
