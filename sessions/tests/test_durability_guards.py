"""Durability guards (issue 24): what test_durability.py's SIGKILL test cannot see.

- A worker SIGKILLed while one turn's slow call runs next to a fast call that already has its
  result: the resumed run executes only the slow call again, the fast one ran exactly once
  (the earlier test kills between one-call turns, where re-running finished calls of the
  last turn changes nothing).
- A worker that was only stalled and finds its run taken over by another worker stops its
  own copy at its next heartbeat: no tool result, model turn or end is written by it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.models import Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.services import runs_sweep
from sessions.tests.conftest import post_message, post_message_sync
from sessions.tests.test_durability import STALE_SECONDS, _wait_for, workers  # noqa: F401 (fixture)
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def test_sigkill_during_a_slow_call_never_reruns_the_fast_call_of_the_same_turn(world, fake_llm, workers, tmp_path):  # noqa: F811
    """The resumed run executes the slow call (it had no result) and not the fast one.

    Mutation: the resume path re-runs calls that already have a result
    (``pending_tool_calls`` without its ``exclude`` of finished statuses): the fast call's
    file gets its line twice. Before 61b74b5 this test failed for another reason: a partly
    answered turn was not resumed at all (the slow call ended ``cancelled``)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_append")
    bind_builtin(agent, "test_sleep")
    log = tmp_path / "appends.txt"
    fake_llm.script(
        ToolCalls([("test_append", {"path": str(log), "text": "fast"}), ("test_sleep", {"seconds": 3})]),
        Reply("Both done."),
    )
    first = workers.start()
    run = post_message_sync(agent=agent, user=world.member, content="append and sleep, in parallel")
    _wait_for(lambda: ToolCall.all_tenants.filter(run_id=run.pk, name="test_append", status="succeeded").exists()
              and ToolCall.all_tenants.filter(run_id=run.pk, name="test_sleep", status="running").exists(),
              what="the fast call to finish while the slow one runs")
    workers.kill(first)  # SIGKILL in the middle of the turn
    assert log.read_text().splitlines() == ["fast"]

    workers.start()
    time.sleep(STALE_SECONDS)
    assert runs_sweep()["resumed"] == 1
    run = _wait_for(lambda: Run.all_tenants.filter(pk=run.pk, status="completed").first(), what="the run to complete")

    assert (run.reply, run.attempt) == ("Both done.", 2)
    assert log.read_text().splitlines() == ["fast"], "the call that had its result ran exactly once"
    calls = list(ToolCall.all_tenants.filter(run_id=run.pk).order_by("id").values_list("name", "status"))
    assert calls == [("test_append", "succeeded"), ("test_sleep", "succeeded")]
    assert len(fake_llm.requests) == 2, "the turn that asked for both calls was not asked again"
    assert [m["role"] for m in fake_llm.requests[1]["messages"]][-3:] == ["assistant", "tool", "tool"]


def test_an_approved_call_next_to_an_allowed_one_runs_when_the_run_resumes(world, fake_llm, no_enqueue):
    """README, Approvals: "the call waits awaiting_approval, the turn's other calls finish ...
    once none is pending, the run is queued and resumes on any worker: approved calls run".
    With one allowed and one asking call in a turn, the approved call must run on resume and
    the model must read both results."""
    from asgiref.sync import async_to_sync

    from sessions.models import Approval

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_echo")
    bind_builtin(agent, "test_big", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "a"}), ("test_big", {"chars": 10})]), Reply("both done"))
    run = post_message_sync(agent=agent, user=world.member, content="two")
    async_to_sync(execute_run)(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"
    [approval] = Approval.all_tenants.filter(run_id=run.pk)
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 200, resp.content
    async_to_sync(execute_run)(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    calls = list(ToolCall.all_tenants.filter(run_id=run.pk).order_by("id").values_list("name", "status"))
    assert calls == [("test_echo", "succeeded"), ("test_big", "succeeded")]
    assert [m["role"] for m in fake_llm.requests[1]["messages"]][-3:] == ["assistant", "tool", "tool"]


@pytest.mark.usefixtures("no_enqueue")
async def test_a_stalled_worker_whose_run_was_taken_over_stops_its_copy(world, fake_llm, settings):
    """The run's heartbeat went stale (the worker stalled), another worker claimed it
    (attempt 2); at its next beat the first copy finds that and stops: it writes neither the
    slow call's result nor a model turn nor the run's end.

    Mutation: the heartbeat's ``owner.cancel()`` removed (or ``not alive`` ignored) in
    ``runner/loop.py``: the stale copy goes on, finishes the call, asks the model and ends
    the run behind the new worker's back."""
    settings.RUN_HEARTBEAT_SECONDS = 0.1

    @sync_to_async
    def make():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
        bind_builtin(agent, "test_sleep")
        return agent

    agent = await make()
    fake_llm.script(ToolCalls([("test_sleep", {"seconds": 2})]), Reply("done"), Reply("done again"))
    run = await post_message(agent=agent, user=world.member, content="sleep")
    stale_copy = asyncio.create_task(execute_run(run.pk))

    @sync_to_async
    def sleep_running() -> bool:
        return ToolCall.all_tenants.filter(run_id=run.pk, name="test_sleep", status="running").exists()

    deadline = time.monotonic() + 15
    while not await sleep_running():
        assert time.monotonic() < deadline and not stale_copy.done(), "the slow call did not start"
        await asyncio.sleep(0.02)

    @sync_to_async
    def take_over() -> int:
        """What another worker's claim does once the heartbeat is stale (the sweeper's handoff)."""
        from sessions.runs.claim import _claim as run_claim

        settings.RUN_STALE_SECONDS = 0  # every heartbeat is stale now: the claim goes through
        with tenant_scope(world.tenant.pk):
            return run_claim(run.pk).attempt

    assert await take_over() == 2
    taken_over_at = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(stale_copy), timeout=1.5)
    assert time.monotonic() - taken_over_at < 1.5, "stopped at its next heartbeat, before the 2 s call ended"
    await asyncio.sleep(2.5)  # past the slow call's end: nothing more is written by the stale copy

    @sync_to_async
    def state():
        row = Run.all_tenants.get(pk=run.pk)
        call = ToolCall.all_tenants.get(run_id=run.pk)
        return (row.status, row.attempt, row.reply), (call.status, call.result)

    assert await state() == (("running", 2, ""), ("running", ""))
    assert len(fake_llm.requests) == 1, "the stale copy asked the model nothing more"
