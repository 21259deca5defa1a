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
    assert fake.types() == ["run_running", "run_awaiting_approval"]  # the pause announces the approval
    (pk,) = store.calls
    store.approve(pk)  # a human approves; the run is queued again
    await execute_run(1, ports=fake.ports)
    assert echo.calls == 1 and store.status == RunStatus.COMPLETED and store.outcome.reply == "done"
    assert store.spec.attempt == 2 and len(fake.model_.prompts) == 2  # the resumed run did not ask the model again first


async def test_a_cancel_mid_answer_ends_the_run_cancelled_with_the_streamed_text():
    blocked = asyncio.Event()  # never set: the turn waits until the cancel stops it
    fake = _ports(blocked)

    async def cancel_soon() -> None:
        while not any(e[0] == "content_token" for e in fake.events):
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


# --- a skill's sub-run goes through its parent run's ports ---------------------------------


def _with_skill(toolset, *, allowed=("echo",)):
    """``toolset`` plus the skill ``helper`` (id 7) allowed ``allowed``, bound to run 1."""
    from capabilities.toolsets import ToolOrigin
    from sessions.runner.spec import SkillBindingSpec
    from sessions.runner.subrun import SkillTool

    skill = SkillBindingSpec(skill_id=7, name="helper", description="Helps.", allowed_tools=allowed)
    toolset.tools["helper"] = SkillTool(skill=skill, exposed_name="helper", parent=run_spec(), parent_toolset=toolset)
    toolset.origins["helper"] = ToolOrigin(source="skill", name="helper", binding_id=2)
    return toolset


def _sub_events(fake, run_id=1001):
    """The events published for sub-run ``run_id``, tokens left out."""
    return [(t, data) for t, data, *rest in fake.events
            if rest == [run_id] and t not in ("content_token", "reasoning_token")]


async def test_a_skill_runs_its_sub_run_over_the_parent_runs_ports():
    """No database: a sub-run going through the production ports would fail here."""
    echo = EchoTool()
    fake = _ports(tool_call("helper", '{"task": "say hi"}'), tool_call("echo", '{"text": "hi"}', call_id="s1"),
                  reply("The echo said hi."), reply("done"), toolset=_with_skill(toolset_of(echo)))
    await execute_run(1, ports=fake.ports)
    store = fake.store
    assert store.status == RunStatus.COMPLETED and store.outcome.reply == "done" and echo.calls == 1
    [sub] = store.subruns.values()
    assert (sub.run_id, sub.status, sub.outcome.reply) == (1001, RunStatus.COMPLETED, "The echo said hi.")
    assert [m["role"] for m in sub.messages] == ["user", "assistant", "tool", "assistant"]  # its own rows
    assert sub.messages[0]["content"] == "say hi" and sub.messages[2]["content"] == "echo: hi"
    # the skill's result is the parent's tool message; the parent's history never saw the sub-run's rows
    assert [m["role"] for m in store.messages] == ["user", "assistant", "tool", "assistant"]
    assert store.messages[2]["content"] == "The echo said hi."
    assert fake.types() == ["run_running", "tool_call_started", "tool_call_progress", "tool_call_succeeded",
                            "run_completed"]
    parent_ids = {"parent_run_id": 1, "parent_tool_call_id": 1}
    sub_events = _sub_events(fake)
    assert [t for t, _ in sub_events] == ["run_running", "tool_call_started", "tool_call_succeeded", "run_completed"]
    assert all(data.items() >= parent_ids.items() for _, data in sub_events)
    assert sub_events[0][1] == {"attempt": 1, "skill": "helper", "depth": 1, "task": "say hi", **parent_ids}
    # the sub-run ended before its skill call's result was published
    ends = [i for i, e in enumerate(fake.events) if e[0] == "run_completed" and e[2:] == (1001,)]
    succeeded = [i for i, e in enumerate(fake.events) if e[0] == "tool_call_succeeded" and e[1]["name"] == "helper"]
    assert ends < succeeded


async def test_a_sub_runs_approval_pauses_the_parent_and_the_same_sub_run_resumes():
    echo = EchoTool()
    fake = _ports(tool_call("helper", '{"task": "say hi"}'), tool_call("echo", '{"text": "hi"}', call_id="s1"),
                  reply("The echo said hi."), reply("done"), toolset=_with_skill(toolset_of(echo, ask=("echo",))))
    await execute_run(1, ports=fake.ports)
    store = fake.store
    [sub] = store.subruns.values()
    assert store.status == RunStatus.AWAITING_APPROVAL and sub.status == RunStatus.AWAITING_APPROVAL
    assert echo.calls == 0
    [(sub_pause, data)] = [(t, d) for t, d in _sub_events(fake) if t == "run_awaiting_approval"]
    [approval] = data["approvals"]
    assert approval["tool_name"] == "echo" and approval["sub_run_id"] == 1001
    assert fake.types()[-1] == "run_awaiting_approval"  # the user's run pauses with the sub-run's approval
    assert [a["approval_id"] for a in fake.events[-1][1]["approvals"]] == [approval["approval_id"]]

    store.approve(approval["tool_call_id"])
    await execute_run(1, ports=fake.ports)
    assert store.status == RunStatus.COMPLETED and store.outcome.reply == "done" and echo.calls == 1
    assert list(store.subruns) == [1001] and (sub.status, sub.attempt) == (RunStatus.COMPLETED, 2)


# --- images and the start context go through the store ------------------------------------

_TENANT = _SESSION = 9_000_001  # ids no database row has: the per-process image cache is keyed by them


async def test_the_images_of_a_user_message_are_read_through_the_store():
    import base64
    from types import SimpleNamespace

    entry = SimpleNamespace(max_input_tokens=100_000, input_price_per_mtok=0, supports_images=True)
    store = MemoryRunStore(run_spec(entries=(entry,), tenant_id=_TENANT, session_id=_SESSION), user_message=(
        'Look\n[image: artifact:7 "cat.png", image/png, 4 B]\n[image: artifact:8 "a.pdf", application/pdf, 3 B]\n'
        '[image: artifact:9 "theirs.png", image/png, 2 B]'))
    store.artifacts = {7: (_SESSION, "image/png", b"\x89PNG"), 8: (_SESSION, "application/pdf", b"pdf"),
                       9: (_SESSION + 1, "image/png", b"..")}  # 9: another chat's
    fake = FakePorts(store, ScriptedModel(reply("A cat.")))
    await execute_run(1, ports=fake.ports)
    assert store.status == RunStatus.COMPLETED
    (user,) = [m for m in fake.model_.prompts[0] if m.role == "user"]
    assert [image.data for image in user.images] == [base64.b64encode(b"\x89PNG").decode()]
    assert '"a.pdf", application/pdf, 3 B] (not shown to you: application/pdf is not an image type' in user.content
    assert '"theirs.png", image/png, 2 B]\n' not in user.content and user.content.endswith('"theirs.png", image/png, 2 B]')


class _NotesKind:
    """A kind that adds a start context and attributes answers (as knowledge does)."""

    key = "notes"
    asked = 0

    def has_run_context(self) -> bool:
        return True

    def has_run_completed(self) -> bool:
        return True

    def run_context_wanted(self, specs, run) -> bool:
        return True

    async def run_context(self, specs, ctx, query):
        from capabilities.registry import ContextBlock

        self.asked += 1
        return [ContextBlock(source="notes", title="Notes", text=f"notes on {query}")]

    async def run_completed(self, specs, ctx, answer):
        return [{"reply": answer.reply, "from": [r.name for r in answer.tool_results]}]


async def test_the_start_context_and_the_attributions_are_read_and_stored_through_the_store(monkeypatch):
    from types import SimpleNamespace

    from capabilities.toolsets import ToolOrigin
    from sessions.runner import run_context

    kind = _NotesKind()
    monkeypatch.setattr(run_context, "kinds", lambda: [kind])
    spec = run_spec(bindings=(SimpleNamespace(kind="notes"),), attempt=1)
    store = MemoryRunStore(spec, user_message="the plan")
    ctx = SimpleNamespace(extra={})
    blocks = await run_context.run_context_open(spec, ctx, store=store)
    assert [b.text for b in blocks] == ["notes on the plan"] and ctx.extra["run_context"] == blocks
    assert store.context == [blocks[0].as_json()]
    # a resumed run reads what was stored, and asks no kind again
    assert await run_context.run_context_open(spec, SimpleNamespace(extra={}), store=store) == blocks
    assert kind.asked == 1

    store.calls = {5: {"run_id": 1, "name": "echo", "status": ToolCallStatus.SUCCEEDED, "data": {"n": 1}},
                   6: {"run_id": 1, "name": "echo", "status": ToolCallStatus.FAILED, "data": {"n": 2}}}
    toolset = SimpleNamespace(context=ctx, origins={"echo": ToolOrigin(source="builtin", name="echo")})
    made = await run_context.run_attributions(spec, toolset, blocks, "The plan.", store=store)
    assert made == [{"reply": "The plan.", "from": ["echo"]}] and store.attributions == made
