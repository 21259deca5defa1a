"""Capability kinds as plugins (issue 24 item 4): a new kind is one module plus its registration.

``ToyKind`` below is a complete capability kind, defined and registered in this test module
only: no other file knows it. Bound to an agent through the REST API, validated by its own
rules, loaded by the runner's configuration read and opened for a run, its tool is offered to
the (scripted) model, called and answered; the approval-policy and naming wrappers apply to
it as to every kind. Then the wrappers themselves: naming as before (qualified MCP aliases,
64-character cap with a hash, independent of listing order) and first-match-wins policies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.models import CapabilityBinding
from agents.tests.factories import agent_with_route
from capabilities.naming import assign_exposed_names
from capabilities.registry import (
    CapabilityKind,
    OpenContext,
    binding_specs,
    kind_choices,
    kind_fields,
    kind_register,
    kind_unregister,
    kinds,
)
from capabilities.tools import ApprovalRequired, Tool, ToolContext, ToolResult
from capabilities.toolsets import KindToolset, NamedToolset, ToolInvocation, ToolOrigin, ToolSource
from llm.testing import Reply, ToolCalls
from llm.types import ToolSpec
from sessions.models import ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

# --- the toy kind: everything a new kind needs ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToySpec:
    kind: ClassVar[str] = "toy"
    greeting: str
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


class ShoutTool(Tool):
    """``{text}`` → ``"<greeting> <TEXT>"``."""

    def __init__(self, greeting: str, exposed: str) -> None:
        self.greeting = greeting
        self.spec = ToolSpec(name=exposed, description="Shout the text back.", parameters={
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
        })

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content=f"{self.greeting} {arguments['text'].upper()}")


class ToyKind(CapabilityKind):
    key = "toy"
    label = "Toy"
    fields = ("approval_policy", "config")

    def validate(self, binding: Any) -> dict[str, Any]:
        if not isinstance(binding.config, dict) or not isinstance(binding.config.get("greeting"), str):
            return {"config": "A toy needs a 'greeting' string."}
        return {}

    def load_spec(self, binding: Any) -> ToySpec:
        return ToySpec(greeting=binding.config["greeting"], binding_id=binding.pk,
                       approval_policy=tuple(binding.approval_policy))

    async def open_toolset(self, specs: Sequence[ToySpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        return [
            (s, KindToolset(sources=[ToolSource(origin=ToolOrigin(source="toy", name="shout"),
                                                factory=lambda exposed, g=s.greeting: ShoutTool(g, exposed))]))
            for s in specs
        ]


@pytest.fixture
def toy_kind():
    kind = kind_register(ToyKind())
    yield kind
    kind_unregister("toy")


# --- a new kind, end to end ---------------------------------------------------------------------


@sync_to_async
def _bind_toy_through_the_api(world, base_url: str, *, config: dict, policy: list | None = None):
    agent = agent_with_route(tenant=world.tenant, base_urls=[base_url])
    resp = world.client(admin=True).post("/api/v1/admin/bindings/", {
        "agent": agent.pk, "kind": "toy", "config": config, "approval_policy": policy or [],
    }, format="json")
    return agent, resp


@sync_to_async
def _calls(run_id: int) -> list[ToolCall]:
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue", "toy_kind")
async def test_a_kind_registered_in_one_module_is_bound_validated_and_offered_to_a_run(world, fake_llm):
    agent, bad = await _bind_toy_through_the_api(world, fake_llm.base_url, config={"colour": "red"})
    assert bad.status_code == 400 and "greeting" in json.dumps(bad.json()), bad.content  # the kind's own check
    agent, resp = await _bind_toy_through_the_api(world, fake_llm.base_url, config={"greeting": "hey"})
    assert resp.status_code == 201, resp.content
    assert resp.json()["kind"] == "toy"

    fake_llm.script(ToolCalls([("shout", {"text": "ping"})]), Reply("done"))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.error
    [call] = await _calls(run.pk)
    assert (call.name, call.status, call.result) == ("shout", "succeeded", "hey PING")
    offered = [t["function"]["name"] for t in fake_llm.requests[0]["tools"]]
    assert offered == ["shout"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue", "toy_kind")
async def test_the_approval_wrapper_applies_to_a_new_kind(world, fake_llm):
    agent, resp = await _bind_toy_through_the_api(
        world, fake_llm.base_url, config={"greeting": "hey"},
        policy=[{"pattern": "shout", "action": "deny"}, {"pattern": "*", "action": "allow"}],
    )
    assert resp.status_code == 201, resp.content
    fake_llm.script(ToolCalls([("shout", {"text": "ping"})]), Reply("done"))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    [call] = await _calls(run.pk)
    assert call.status == "failed" and "policy does not allow the tool 'shout'" in call.error


@pytest.mark.django_db
@pytest.mark.usefixtures("toy_kind")
def test_forms_and_choices_follow_the_registry(world):
    from console.forms import BindingForm

    assert ("toy", "Toy") in kind_choices()
    assert kind_fields()["toy"] == ["approval_policy", "config"]
    form = BindingForm()
    assert ("toy", "Toy") in list(form.fields["kind"].choices)
    assert json.loads(form.fields["kind"].widget.attrs["data-binding-kind"])["toy"] == ["approval_policy", "config"]
    field = CapabilityBinding._meta.get_field("kind")
    assert "toy" in [value for value, _label in field.choices]


@pytest.mark.django_db
def test_unregistered_kinds_are_refused_and_skipped(world):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
    resp = world.client(admin=True).post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "toy"}, format="json")
    assert resp.status_code == 400 and "kind" in resp.json()["extra"]["fields"], resp.content
    stray = CapabilityBinding(tenant=world.tenant, agent=agent, kind="toy", config={"greeting": "x"})
    assert binding_specs([stray]) == ()


def test_a_key_registers_once_and_fields_are_checked():
    class Other(ToyKind):
        pass

    class Odd(ToyKind):
        key = "odd"
        fields = ("approval_policy", "colour")

    kind_register(ToyKind())
    try:
        with pytest.raises(ValueError, match="registered twice"):
            kind_register(Other())
        with pytest.raises(ValueError, match="unknown binding fields"):
            kind_register(Odd())
    finally:
        kind_unregister("toy")
    keys = [k.key for k in kinds()]  # apps add kinds of their own (knowledge, memory): the core ones keep their order
    core = ["mcp_server", "builtin", "cli", "browser", "skill"]
    assert "toy" not in keys and [k for k in keys if k in core] == core


# --- the wrappers -------------------------------------------------------------------------------


def _toolset(source: str, *names: str, qualified: bool = False, policy: tuple = (), binding_id: int = 1):
    return KindToolset(sources=[ToolSource(origin=ToolOrigin(source=source, name=n), factory=_ran_tool)
                                for n in names], qualified=qualified).for_binding(binding_id, policy)


class _RanTool(Tool):
    def __init__(self, exposed: str) -> None:
        self.spec = ToolSpec(name=exposed, description="Say it ran.")

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content=f"{self.spec.name} ran")


def _ran_tool(exposed: str) -> Tool:
    return _RanTool(exposed)


def test_named_toolset_names_as_assign_exposed_names_does():
    long = "x" * 70
    toolsets = [
        _toolset("time", "get_time", "convert", qualified=True),
        _toolset("builtin", "web_fetch", "get_time"),
        _toolset("cli", long, "web_fetch"),
    ]
    named = {(s.origin.source, s.origin.name): exposed for exposed, s in NamedToolset(toolsets).named()}
    pairs = [("time", "get_time"), ("time", "convert"), ("builtin", "web_fetch"), ("builtin", "get_time"),
             ("cli", long), ("cli", "web_fetch")]
    assert named == assign_exposed_names(pairs, qualified_sources={"time"})
    assert named[("time", "get_time")] == "time__get_time" and named[("builtin", "get_time")] == "get_time"
    assert all(len(n) <= 64 for n in named.values()) and len(set(named.values())) == len(named)
    shuffled = [_toolset("time", "convert", "get_time", qualified=True), *toolsets[1:]]
    assert {(s.origin.source, s.origin.name): e for e, s in NamedToolset(shuffled).named()} == named


async def test_approval_wrapper_first_match_wins_on_own_or_exposed_name():
    """The run's toolset decides each call by its binding's rules (the approval wrapper):
    ``ask`` raises ApprovalRequired before the tool runs, ``deny`` fails it, no rule runs it."""
    from sessions.runner.toolset import Toolset

    def call(name: str, *, approved: bool = False) -> ToolInvocation:
        context = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1, approved=approved)
        return ToolInvocation(name=name, arguments={}, context=context)

    policy = ({"pattern": "time__*", "action": "ask"}, {"pattern": "get_time", "action": "deny"})
    toolset = Toolset()
    toolset.table.add_named([_toolset("time", "get_time", qualified=True, policy=policy, binding_id=7),
                             _toolset("builtin", "echo")])
    assert toolset.origins["time__get_time"].binding_id == 7
    with pytest.raises(ApprovalRequired, match="asks before get_time"):  # exposed name, first rule
        await toolset.call_tool(call("time__get_time"))
    assert (await toolset.call_tool(call("echo"))).content == "echo ran"  # its own binding has no rules
    assert (await toolset.call_tool(call("time__get_time", approved=True))).content == "time__get_time ran"
    reordered = (policy[1], policy[0])
    toolset.origins["time__get_time"] = ToolOrigin(source="time", name="get_time", approval_policy=reordered)
    denied = await toolset.call_tool(call("time__get_time"))  # own name, now first
    assert (denied.status, denied.content) == ("failed", "")
    assert "does not allow the tool 'time__get_time'" in denied.error


@pytest.mark.django_db
def test_run_reads_exactly_one_spec_per_toy_binding(world, toy_kind):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
    rows = [CapabilityBinding(pk=i, tenant=world.tenant, agent=agent, kind="toy", config={"greeting": f"g{i}"})
            for i in (1, 2)]
    specs = binding_specs(rows)
    assert [s.greeting for s in specs] == ["g1", "g2"] and {s.kind for s in specs} == {"toy"}
