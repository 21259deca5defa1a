"""Usage and cost per LLM call and per run; per-run and per-tenant budgets."""

from __future__ import annotations

from decimal import Decimal

import pytest
from channels.db import database_sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.models import ModelRouteEntry
from llm.testing import Reply, ToolCalls
from sessions.models import LLMCall, Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@database_sync_to_async
def priced_agent(world, url, *, input_price="1.5", output_price="4", **agent_fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url], **agent_fields)
    bind_builtin(agent, "test_echo")
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(
        input_price_per_mtok=Decimal(input_price), output_price_per_mtok=Decimal(output_price)
    )
    return agent


@database_sync_to_async
def calls(run_id):
    return list(LLMCall.all_tenants.filter(run_id=run_id).order_by("id"))


async def test_cost_per_call_and_run_totals_come_from_provider_usage(world, fake_llm):
    agent = await priced_agent(world, fake_llm.base_url)
    fake_llm.script(ToolCalls([("test_echo", {"text": "x"})]), Reply("done", usage=(1000, 200)))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    first, second = await calls(run.pk)
    assert (second.prompt_tokens, second.completion_tokens, second.usage_estimated) == (1000, 200, False)
    assert second.cost_usd_micros == 1000 * 1.5 + 200 * 4  # USD per million tokens × tokens = micro-USD
    run = await reload_run(run.pk)
    assert run.prompt_tokens == first.prompt_tokens + 1000
    assert run.completion_tokens == first.completion_tokens + 200
    assert run.cost_usd_micros == first.cost_usd_micros + second.cost_usd_micros


async def test_usage_is_estimated_and_marked_when_the_provider_reports_none(world, fake_llm):
    agent = await priced_agent(world, fake_llm.base_url)
    fake_llm.script(Reply("an answer of some length", include_usage=False))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    [call] = await calls(run.pk)
    assert call.usage_estimated and call.prompt_tokens > 0 and call.completion_tokens > 0


async def test_per_run_token_budget_stops_before_the_call_that_would_exceed_it(world, fake_llm):
    agent = await priced_agent(world, fake_llm.base_url, max_tokens_per_run=5)
    run = await post_message(agent=agent, user=world.member, content="a question long enough to cost more than five tokens")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert "budget of 5 tokens" in run.error
    assert fake_llm.requests == []


async def test_per_run_cost_budget_stops_the_second_turn(world, fake_llm):
    # At $1000 per million prompt tokens the first turn costs ~$0.52; the second prompt repeats
    # the text in the tool call and its result (~3× longer), so it would pass the $1.50 budget.
    agent = await priced_agent(world, fake_llm.base_url, input_price="1000", output_price="0",
                               max_cost_per_run_usd=Decimal("1.5"))
    fake_llm.script(ToolCalls([("test_echo", {"text": "x" * 2000})]))
    fake_llm.requests.clear()
    run = await post_message(agent=agent, user=world.member, content="y" * 2000)
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert len(fake_llm.requests) == 1


async def test_tenant_monthly_budget(world, fake_llm):
    agent = await priced_agent(world, fake_llm.base_url)

    @database_sync_to_async
    def spend_the_month():
        world.tenant.monthly_budget_usd = Decimal("10")
        world.tenant.save()
        earlier = Run.all_tenants.create(tenant=world.tenant, session=run.session, user=world.member, input="old")
        LLMCall.all_tenants.create(tenant=world.tenant, run=earlier, turn=0, attempt=1, entry_index=0,
                                   provider_name="p", model="m", status="succeeded", cost_usd_micros=10_000_000)

    run = await post_message(agent=agent, user=world.member, content="go")
    await spend_the_month()
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert "monthly model budget" in run.error
