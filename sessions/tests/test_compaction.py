"""Compaction: crossing the budget, the summary replacing history, bounded attempts, the
entry actually called, and compacting before falling back on a context-window rejection; the
summarizer's calls are LLM calls of purpose ``compaction`` (of their run and turn), counted by
the run's totals, its budgets and the tenant's monthly budget."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.models import ModelRouteEntry
from llm.testing import Fail, Reply, ToolCalls
from llm.tokens import estimate_tokens
from llm.types import ChatMessage
from sessions.models import Compaction, LLMCall, Run
from sessions.runner.compaction import SUMMARIZER_PROMPT, SUMMARY_HEADER
from sessions.runner.loop import execute_run
from sessions.selectors import tenant_month_cost_usd_micros
from sessions.tests.conftest import post_message, reload_run
from tenants.models import Tenant
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@database_sync_to_async
def make_agent(world, urls, windows, **fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=urls, **fields)
    bind_builtin(agent, "test_echo")
    for position, window in enumerate(windows):
        ModelRouteEntry.all_tenants.filter(route=agent.route, position=position).update(max_input_tokens=window)
    return agent


@database_sync_to_async
def compactions(run_id):
    return list(Compaction.all_tenants.filter(run_id=run_id).order_by("id"))


def system_of(request):
    return request["messages"][0]["content"]


async def test_crossing_the_budget_compacts_and_later_turns_send_summary_and_recent_messages(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], [2000])  # budget: 0.7 × 2000 = 1400 tokens
    first, second = "a" * 1600, "b" * 1600
    fake_llm.script(
        ToolCalls([("test_echo", {"text": first})]),
        ToolCalls([("test_echo", {"text": second})]),
        Reply("## Goal\n- echo two long texts\n## Progress\n- S1"),
        Reply("## Goal\n- echo two long texts\n## Progress\n- first echoed; S2"),
        Reply("Both echoed."),
    )
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "Both echoed.")
    assert [system_of(r) == SUMMARIZER_PROMPT for r in fake_llm.requests] == [False, False, True, True, False]
    assert "EARLIER SUMMARY:\n## Goal" in fake_llm.requests[3]["messages"][1]["content"]
    [c1, c2] = await compactions(run.pk)
    assert (c1.status, c2.status) == ("succeeded", "succeeded")
    assert c2.tokens_before > 1400 and c2.tokens_after < c2.tokens_before
    last = fake_llm.requests[4]
    assert SUMMARY_HEADER + "## Goal\n- echo two long texts\n## Progress\n- first echoed; S2" in system_of(last)
    sent = json.dumps(last["messages"])
    assert first not in sent, "summarized messages are no longer sent"
    assert second in sent, "the latest call and its result are kept verbatim"
    roles = [m["role"] for m in last["messages"][1:]]
    assert roles == ["assistant", "tool"], "a tool call and its result are never split"


async def test_a_summarizer_that_fails_three_times_fails_the_run_without_looping(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], [2000])
    down = Fail(500, body={"error": {"message": "summarizer down"}})
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "a" * 1600})]),
        ToolCalls([("test_echo", {"text": "b" * 1600})]),
        down, down, down,
    )
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "compaction_failed")
    assert "3 attempts" in run.error
    assert [c.status for c in await compactions(run.pk)] == ["failed"] * 3
    assert len(fake_llm.requests) == 5, "two turns, three summarizer attempts, nothing more"


async def test_the_trigger_uses_the_entry_actually_called_after_a_fallback(world, fake_llm, second_fake_llm):
    # Entry 0 has a huge window but fails the first turn; entry 1 (2,000 tokens) answers, so the
    # next prompt is measured against 2,000, not 100,000.
    agent = await make_agent(world, [fake_llm.base_url, second_fake_llm.base_url], [100_000, 2000])
    fake_llm.script(Fail(500, body={"error": {"message": "down"}}), Reply("## Goal\n- S"), Reply("done"))
    second_fake_llm.script(ToolCalls([("test_echo", {"text": "c" * 3000})]))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    assert len(await compactions(run.pk)) == 1
    assert system_of(fake_llm.requests[1]) == SUMMARIZER_PROMPT


async def test_a_context_window_rejection_compacts_before_falling_back_to_a_larger_entry(
    world, fake_llm, second_fake_llm
):
    agent = await make_agent(world, [fake_llm.base_url, second_fake_llm.base_url], [100_000, 200_000])
    too_long = Fail(400, body={"error": {"message": "This model's maximum context length is 8192 tokens",
                                         "code": "context_length_exceeded"}})
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "x"})]),
        too_long,
        Reply("## Goal\n- S"),
        Reply("Answered after compaction."),
    )
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "Answered after compaction.")
    assert second_fake_llm.requests == [], "the larger entry is only for when compaction cannot help"
    assert len(await compactions(run.pk)) == 1


# --- the compaction's model calls: LLM calls of purpose compaction (issue 26 follow-up) ----------


@database_sync_to_async
def llm_calls(run_id):
    """The run's LLM calls in the order written: ``(purpose, turn, status)``."""
    return [(c.purpose, c.turn, c.status) for c in LLMCall.all_tenants.filter(run_id=run_id).order_by("id")]


def _two_compactions_script(fake_llm, *, summary_usage=None):
    """The first test's run: two echo turns, two summaries (the first is not enough), an answer."""
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "a" * 1600})]),
        ToolCalls([("test_echo", {"text": "b" * 1600})]),
        Reply("## Goal\n- echo two long texts\n## Progress\n- S1", usage=summary_usage),
        Reply("## Goal\n- echo two long texts\n## Progress\n- first echoed; S2", usage=summary_usage),
        Reply("Both echoed."),
    )


async def test_the_summarizer_calls_are_llm_calls_of_purpose_compaction_with_their_run_and_turn(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], [2000])
    _two_compactions_script(fake_llm)
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed"
    summarizer = [system_of(r) == SUMMARIZER_PROMPT for r in fake_llm.requests]
    rows = await llm_calls(run.pk)
    # One row per request, in order: the summarizer's are compaction, the others turn.
    assert [p for p, _, _ in rows] == ["compaction" if s else "turn" for s in summarizer]
    assert [p for p, _, _ in rows] == ["turn", "turn", "compaction", "compaction", "turn"]
    # A compaction carries the turn it made room for (the answer's): per-run usage counts it.
    assert [t for _, t, _ in rows] == [0, 1, 2, 2, 2]
    assert {s for _, _, s in rows} == {"succeeded"}


async def test_a_failing_summarizers_attempts_are_failed_compaction_calls(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], [2000])
    down = Fail(500, body={"error": {"message": "summarizer down"}})
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "a" * 1600})]),
        ToolCalls([("test_echo", {"text": "b" * 1600})]),
        down, down, down,
    )
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).reason == "compaction_failed"
    assert await llm_calls(run.pk) == [("turn", 0, "succeeded"), ("turn", 1, "succeeded")] + [
        ("compaction", 2, "failed")] * 3


async def test_a_rejected_prompt_stays_a_turn_call_and_the_compaction_after_it_is_not(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], [100_000])
    too_long = Fail(400, body={"error": {"message": "This model's maximum context length is 8192 tokens",
                                         "code": "context_length_exceeded"}})
    fake_llm.script(ToolCalls([("test_echo", {"text": "x"})]), too_long, Reply("## Goal\n- S"), Reply("Answered."))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    assert [(p, s) for p, _, s in await llm_calls(run.pk)] == [
        ("turn", "succeeded"), ("turn", "failed"), ("compaction", "succeeded"), ("turn", "succeeded")]


async def test_a_compactions_tokens_count_in_the_runs_totals_and_stop_it_at_its_token_budget(world, fake_llm):
    # Without the two summaries (50,000 prompt tokens each, as the provider reports them) the
    # run stays far under its 60,000-token budget; with them, the answer's turn is refused.
    agent = await make_agent(world, [fake_llm.base_url], [2000], max_tokens_per_run=60_000)
    _two_compactions_script(fake_llm, summary_usage=(50_000, 10))
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert "budget of 60000 tokens" in run.error
    assert len(fake_llm.requests) == 4, "the answer's turn is not called"

    @database_sync_to_async
    def sums():
        calls = LLMCall.all_tenants.filter(run_id=run.pk)
        compaction = calls.filter(purpose="compaction")
        with tenant_scope(world.tenant.pk):
            month = tenant_month_cost_usd_micros()
        return (compaction.count(), sum(c.prompt_tokens + c.completion_tokens for c in compaction),
                sum(c.prompt_tokens + c.completion_tokens for c in calls), sum(c.cost_usd_micros for c in calls),
                month)

    n, compaction_tokens, all_tokens, cost, month = await sums()
    assert (n, compaction_tokens) == (2, 100_020)
    assert run.prompt_tokens + run.completion_tokens == all_tokens
    assert run.cost_usd_micros == cost and month == cost, "the monthly budget's sum counts them too"


async def test_the_monthly_budget_counts_compaction_calls(world, fake_llm):
    # The month's whole spending is one compaction call of an earlier run: the budget is spent.
    agent = await make_agent(world, [fake_llm.base_url], [100_000])
    run = await post_message(agent=agent, user=world.member, content="go")

    @database_sync_to_async
    def spend_the_month_on_a_compaction():
        Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal("10"))
        earlier = Run.all_tenants.create(tenant=world.tenant, session=run.session, user=world.member, input="old")
        LLMCall.all_tenants.create(tenant=world.tenant, run=earlier, turn=0, purpose="compaction", attempt=1,
                                   entry_index=0, provider_name="p", model="m", status="succeeded",
                                   cost_usd_micros=10_000_001)  # a micro-dollar over (the route is unpriced)

    await spend_the_month_on_a_compaction()
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert "monthly model budget" in run.error and fake_llm.requests == []


# --- the budget before compacting: a run that may not spend more never calls the summarizer -------


@database_sync_to_async
def compaction_call_count(run_id):
    return LLMCall.all_tenants.filter(run_id=run_id, purpose="compaction").count()


def _over_at_turn_two_script(fake_llm, *, turn_usage):
    """Two echo turns reporting ``turn_usage`` (``(prompt, completion)`` each; the run's
    totals after them are their sums), the two summaries the third turn's compaction would
    ask for, and the answer."""
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "a" * 1600})], usage=turn_usage[0]),
        ToolCalls([("test_echo", {"text": "b" * 1600})], usage=turn_usage[1]),
        Reply("## Goal\n- S1"),
        Reply("## Goal\n- S2"),
        Reply("Both echoed."),
    )


async def test_a_run_over_its_token_budget_where_compaction_is_due_fails_without_compacting(world, fake_llm):
    # After the second turn the run has used 70,110 tokens of its 60,000: turn 3 must compact
    # first (its prompt passes 1,400 tokens), and that summary request is not made.
    agent = await make_agent(world, [fake_llm.base_url], [2000], max_tokens_per_run=60_000)
    _over_at_turn_two_script(fake_llm, turn_usage=[(100, 10), (70_000, 0)])
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert await compaction_call_count(run.pk) == 0 and await compactions(run.pk) == []
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert run.error.startswith("The run has used 70110 tokens; compacting the conversation before the next "
                                "model turn (~"), run.error
    assert "budget of 60000 tokens per run" in run.error
    assert len(fake_llm.requests) == 2, "no summarizer request, no third turn"


async def test_a_summary_request_that_would_pass_the_token_budget_is_not_made(world, fake_llm):
    # 10,100 tokens used of 10,150: the run is still under its budget, but the summary request
    # (the summarizer's instructions and the transcript, ~100+ tokens) would pass it.
    agent = await make_agent(world, [fake_llm.base_url], [2000], max_tokens_per_run=10_150)
    _over_at_turn_two_script(fake_llm, turn_usage=[(100, 0), (10_000, 0)])
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert await compaction_call_count(run.pk) == 0 and len(fake_llm.requests) == 2
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert run.error.startswith("The run has used 10100 tokens; compacting the conversation"), run.error
    # The estimate is the request's the summarizer would have got: its instructions and the
    # transcript of what the first attempt summarizes (the user's message; the two echo groups
    # are kept).
    estimate = int(run.error.split("(~")[1].split(" ")[0])
    assert estimate == estimate_tokens([ChatMessage(role="system", content=SUMMARIZER_PROMPT),
                                        ChatMessage(role="user", content="USER: echo two long texts")])
    assert 10_100 + estimate > 10_150


async def test_a_tenant_at_its_monthly_budget_where_compaction_is_due_fails_without_compacting(world, fake_llm):
    # $1 per million input tokens: the second turn's reported 999,900 prompt tokens bring the
    # month to exactly its $1.00 budget, so the summary request's cost would pass it.
    agent = await make_agent(world, [fake_llm.base_url], [2000])

    @database_sync_to_async
    def price_route_and_budget_tenant():
        ModelRouteEntry.all_tenants.filter(route=agent.route).update(
            input_price_per_mtok=Decimal("1"), output_price_per_mtok=Decimal("0"))
        Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal("1"))

    await price_route_and_budget_tenant()
    _over_at_turn_two_script(fake_llm, turn_usage=[(100, 0), (999_900, 0)])
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert await compaction_call_count(run.pk) == 0 and await compactions(run.pk) == []
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    assert run.error == ("The tenant has used $1.00 of its $1.00 monthly model budget; compacting the "
                         "conversation before the next model turn would exceed it."), run.error
    assert len(fake_llm.requests) == 2


async def test_a_run_under_its_budgets_still_compacts(world, fake_llm):
    # The same run with room left in both budgets: it compacts twice and answers.
    agent = await make_agent(world, [fake_llm.base_url], [2000], max_tokens_per_run=20_000)

    @database_sync_to_async
    def price_route_and_budget_tenant():
        ModelRouteEntry.all_tenants.filter(route=agent.route).update(
            input_price_per_mtok=Decimal("1"), output_price_per_mtok=Decimal("0"))
        Tenant.objects.filter(pk=world.tenant.pk).update(monthly_budget_usd=Decimal("1"))

    await price_route_and_budget_tenant()
    _over_at_turn_two_script(fake_llm, turn_usage=[(100, 10), (5_000, 10)])
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "Both echoed.")
    assert await compaction_call_count(run.pk) == 2
    assert [c.status for c in await compactions(run.pk)] == ["succeeded", "succeeded"]


async def test_the_run_activities_api_gives_each_llm_call_its_purpose(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url], [2000])
    _two_compactions_script(fake_llm)
    run = await post_message(agent=agent, user=world.member, content="echo two long texts")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"

    def activities():
        return world.client().get(f"/api/v1/runs/{run.pk}/activities/").json()["results"]

    items = await database_sync_to_async(activities)()
    calls = [(a["purpose"], a["turn"]) for a in items if a["kind"] == "llm_call"]
    assert calls == [("turn", 0), ("turn", 1), ("compaction", 2), ("compaction", 2), ("turn", 2)]
    assert all("purpose" not in a for a in items if a["kind"] != "llm_call")
