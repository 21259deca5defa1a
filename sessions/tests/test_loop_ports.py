"""The run loop (:func:`sessions.runner.loop.execute_run`) over in-memory ports
(sessions/tests/fakes.py): no database, no Redis, no model server. Each test drives a whole
run through the dispatch (Completed, Failed(reason), Paused, Continue) and checks what the
store recorded and what was published. The production adapters are tested by the
DB-backed runner tests (test_runner*.py, test_durability*.py, test_approvals.py, ...)."""

from __future__ import annotations

import asyncio

from llm.errors import ModelCallError
from sessions.models import RunFailureReason, RunStatus, ToolCallStatus
from sessions.runner.loop import FINAL_TURN_NOTE, execute_run
from sessions.tests.fakes import (
    EchoTool,
    FakePorts,
    MemoryRunStore,
    ScriptedModel,
    reply,
    run_spec,
    tool_call,
    toolset_of,
)


def _ports(*script, toolset=None, **spec) -> FakePorts:
    return FakePorts(MemoryRunStore(run_spec(**spec)), ScriptedModel(*script), toolset)


async def test_a_tool_call_then_a_reply_completes():
    echo = EchoTool()
    fake = _ports(tool_call("echo", '{"text": "hi"}'), reply("It said hi."), toolset=toolset_of(echo))
    await execute_run(1, ports=fake.ports)
    store = fake.store
    assert store.status == RunStatus.COMPLETED and store.outcome.reply == "It said hi."
    assert echo.calls == 1
    assert [c["status"] for c in store.calls.values()] == [ToolCallStatus.SUCCEEDED]
    assert fake.types() == ["run_running", "tool_call_started", "tool_call_succeeded", "run_completed"]
    # the second model turn read the tool's result from the store's history
    assert fake.model_.prompts[1][-1].role == "tool" and fake.model_.prompts[1][-1].content == "echo: hi"
    assert store.completed_hooks == 1


async def test_a_model_error_fails_the_run_with_model_error():
    fake = _ports(ModelCallError("bad_request", "the provider said no"))
    await execute_run(1, ports=fake.ports)
    outcome = fake.store.outcome
    assert fake.store.status == RunStatus.FAILED and outcome.reason == RunFailureReason.MODEL_ERROR
    assert "bad_request" in outcome.error and "the provider said no" not in outcome.error  # members read the class only
    assert fake.types()[-1] == "run_failed" and fake.store.completed_hooks == 0


async def test_a_call_under_an_ask_policy_pauses_and_the_approved_call_runs_on_resume():
    echo = EchoTool()
    fake = _ports(tool_call("echo", '{"text": "x"}'), reply("done"), toolset=toolset_of(echo, ask=("echo",)))
    await execute_run(1, ports=fake.ports)
    store = fake.store
    assert store.status == RunStatus.AWAITING_APPROVAL and echo.calls == 0
    assert fake.types() == ["run_running", "approval_requested", "run_awaiting_approval"]
    (pk,) = store.calls
    store.approve(pk)  # a human approves; the run is queued again
    await execute_run(1, ports=fake.ports)
    assert echo.calls == 1 and store.status == RunStatus.COMPLETED and store.outcome.reply == "done"
    assert store.spec.attempt == 2 and len(fake.model_.prompts) == 2  # the resumed run did not ask the model again first


async def test_a_cancel_mid_answer_ends_the_run_cancelled_with_the_streamed_text():
    blocked = asyncio.Event()  # never set: the turn waits until the cancel stops it
    fake = _ports(blocked)

    async def cancel_soon() -> None:
        while not any(t == "content_token" for t, _ in fake.events):
            await asyncio.sleep(0.005)
        fake.cancel()

    canceller = asyncio.create_task(cancel_soon())
    await asyncio.wait_for(execute_run(1, ports=fake.ports), timeout=5)
    await canceller
    store = fake.store
    assert store.status == RunStatus.CANCELLED and store.outcome.reply == "partial "
    assert fake.types()[-1] == "run_cancelled"


async def test_max_turns_ends_failed_after_a_final_turn_without_tools():
    echo = EchoTool()
    call = tool_call("echo", '{"text": "again"}')
    fake = _ports(call, call, toolset=toolset_of(echo), max_loop_count=2)
    await execute_run(1, ports=fake.ports)
    store = fake.store
    assert store.status == RunStatus.FAILED and store.outcome.reason == RunFailureReason.MAX_LOOP_COUNT
    assert echo.calls == 1  # the final turn's call was dropped (tools were withheld)
    assert fake.model_.offered[1] == [] and fake.model_.prompts[1][-1].content == FINAL_TURN_NOTE


async def test_invalid_json_arguments_fail_the_call_and_the_model_reads_why():
    echo = EchoTool()
    fake = _ports(tool_call("echo", "{not json"), reply("sorry"), toolset=toolset_of(echo))
    await execute_run(1, ports=fake.ports)
    assert fake.store.status == RunStatus.COMPLETED and echo.calls == 0
    assert [c["status"] for c in fake.store.calls.values()] == [ToolCallStatus.FAILED]
    assert "not valid JSON" in fake.model_.prompts[1][-1].content


async def test_a_run_that_is_not_claimable_does_nothing():
    fake = _ports(reply("never asked"))
    fake.store.status = RunStatus.COMPLETED
    await execute_run(1, ports=fake.ports)
    assert fake.events == [] and fake.model_.prompts == [] and fake.opened == 0


async def test_an_unknown_run_does_nothing():
    fake = _ports(reply("never asked"))
    await execute_run(2, ports=fake.ports)
    assert fake.events == [] and fake.store.status == RunStatus.QUEUED
