"""The run-start hook (``CapabilityKind.run_context``): a kind's blocks reach the model's
first request after the system prompt, are stored on the run, and a resumed run sees the same
blocks without asking the kind again; a kind that fails leaves the run going."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from asgiref.sync import async_to_sync

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route
from capabilities.registry import CapabilityKind, ContextBlock, OpenContext, kind_register, kind_unregister
from capabilities.tools import Tool, ToolContext, ToolResult
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource
from llm.testing import Reply, ToolCalls
from llm.types import ToolSpec
from sessions.models import Approval, Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)


@dataclass(frozen=True, slots=True)
class NoteSpec:
    kind: ClassVar[str] = "note"
    note: str
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


class PingTool(Tool):
    def __init__(self, exposed: str) -> None:
        self.spec = ToolSpec(name=exposed, description="Ping.", parameters={"type": "object", "properties": {}})

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content="pong")


class NoteKind(CapabilityKind):
    """Adds ``config.note`` (and what it was asked) as a block; ``config.fail``: raises instead."""

    key = "note"
    label = "Note"
    fields = ("approval_policy", "config")
    asked: ClassVar[list[tuple[str, int | None, int | None, int | None]]] = []

    def load_spec(self, binding: Any) -> NoteSpec:
        return NoteSpec(note=binding.config.get("note", ""), binding_id=binding.pk,
                        approval_policy=tuple(binding.approval_policy))

    async def open_toolset(self, specs: Sequence[NoteSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        return [(s, KindToolset(sources=[ToolSource(origin=ToolOrigin(source="note", name="ping"),
                                                    factory=lambda exposed: PingTool(exposed))])) for s in specs]

    async def run_context(self, specs: Sequence[NoteSpec], ctx: OpenContext, query: str) -> list[ContextBlock]:
        type(self).asked.append((query, ctx.user_id, ctx.agent_id, ctx.run_id))
        if specs[0].note == "fail":
            raise RuntimeError("the note store is down")
        return [ContextBlock(source="note", title="A note for this request:", text=f"{specs[0].note} (asked: {query})",
                             data={"n": 1})]


@pytest.fixture
def note_kind():
    NoteKind.asked = []
    kind = kind_register(NoteKind())
    yield kind
    kind_unregister("note")


def _agent(world, fake_llm, *, note: str, policy: list | None = None):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    agent.system_prompt = "You are the test agent."
    agent.save(update_fields=["system_prompt"])
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind="note", config={"note": note},
                                         approval_policy=policy or [])
    return agent


@pytest.mark.usefixtures("note_kind")
def test_the_block_is_in_the_first_request_after_the_system_prompt_and_stored(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, note="The office opens at 9.")
    fake_llm.script(Reply("At 9."))
    run = post_message_sync(agent=agent, user=world.member, content="When does the office open?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    system = fake_llm.requests[0]["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith("You are the test agent.")
    assert system["content"].endswith(
        "A note for this request:\nThe office opens at 9. (asked: When does the office open?)")
    assert fake_llm.requests[0]["messages"][-1] == {"role": "user", "content": "When does the office open?"}
    assert NoteKind.asked == [("When does the office open?", world.member.pk, agent.pk, run.pk)]
    assert run.context == [{"source": "note", "title": "A note for this request:",
                            "text": "The office opens at 9. (asked: When does the office open?)", "data": {"n": 1}}]


@pytest.mark.usefixtures("note_kind")
def test_a_resumed_run_sees_the_same_blocks_without_asking_the_kind_again(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, note="Remember the blue door.", policy=[{"pattern": "ping", "action": "ask"}])
    fake_llm.script(ToolCalls([("ping", {})]), Reply("Done."))
    run = post_message_sync(agent=agent, user=world.member, content="Ping please")
    run_now(run.pk)
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"
    approval = Approval.all_tenants.get(run_id=run.pk)
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 200, resp.content

    # The stored context is what the resumed run reads (the kind is not asked again).
    Run.all_tenants.filter(pk=run.pk).update(context=[{"source": "note", "title": "Stored:", "text": "as stored",
                                                        "data": None}])
    run_now(run.pk)
    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    assert len(NoteKind.asked) == 1
    assert fake_llm.requests[0]["messages"][0]["content"].endswith("(asked: Ping please)")
    assert fake_llm.requests[1]["messages"][0]["content"].endswith("Stored:\nas stored")


@pytest.mark.usefixtures("note_kind")
def test_a_kind_whose_context_fails_leaves_the_run_going(world, fake_llm, no_enqueue):
    agent = _agent(world, fake_llm, note="fail")
    fake_llm.script(Reply("Fine anyway."))
    run = post_message_sync(agent=agent, user=world.member, content="Hello")
    run_now(run.pk)
    run = Run.all_tenants.get(pk=run.pk)
    assert (run.status, run.reply, run.context) == ("completed", "Fine anyway.", [])
    assert fake_llm.requests[0]["messages"][0]["content"] == "You are the test agent."


def test_runs_without_a_context_kind_store_nothing(world, fake_llm, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.script(Reply("Hi."))
    run = post_message_sync(agent=agent, user=world.member, content="Hello")
    run_now(run.pk)
    run = Run.all_tenants.get(pk=run.pk)
    assert (run.status, run.context) == ("completed", None)
