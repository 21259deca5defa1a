"""Tool calls pass through interceptors (issue 35 item 1): a new behaviour around tool calls is
one wrapper class plus its line in :data:`sessions.runner.interceptors.INTERCEPTORS`.

The wrappers below exist only in this module. Registered for one test, they apply to the run's
tool calls through the normal executor: over the in-memory ports (sessions/tests/fakes.py) and
in a run through the production ports (PostgreSQL, the capability kinds, a scripted model
server). Then what the built-in wrappers do through the same path: an output too large for the
model is stored through the ports' tool store.
"""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.tests.factories import agent_with_route, bind_builtin
from capabilities.tools import Tool, ToolContext, ToolResult
from capabilities.toolsets import ApprovalPolicyToolset, ToolInvocation, ToolOutcome, WrapperToolset
from llm.testing import Reply, ToolCalls
from llm.types import ToolSpec
from sessions.models import RunStatus, ToolCall, ToolCallStatus
from sessions.runner import interceptors
from sessions.runner.compression import ARTIFACT_MIN_CHARS
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run
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


class BlockSecrets(WrapperToolset):
    """Test-only guardrail: a call whose ``text`` mentions a secret fails without running."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        if "secret" in str((call.arguments or {}).get("text", "")):
            return ToolOutcome.failure("Blocked by the guardrail: no secrets.", code="guardrail")
        return await self.wrapped.call_tool(call)


class LowerCaseText(WrapperToolset):
    """Test-only rewrite: the call's ``text`` argument reaches the tool in lower case."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        if call.arguments is not None and isinstance(call.arguments.get("text"), str):
            call.arguments = {**call.arguments, "text": call.arguments["text"].lower()}
        return await self.wrapped.call_tool(call)


def _register(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guardrail right after the approval policy, the rewrite innermost (next to the tool)."""
    rest = [w for w in interceptors.INTERCEPTORS if w is not ApprovalPolicyToolset]
    monkeypatch.setattr(interceptors, "INTERCEPTORS", (ApprovalPolicyToolset, BlockSecrets, *rest, LowerCaseText))


async def test_registered_wrappers_rewrite_and_block_a_runs_tool_calls(monkeypatch):
    _register(monkeypatch)
    echo = EchoTool()
    fake = FakePorts(MemoryRunStore(run_spec()), ScriptedModel(
        tool_call("echo", '{"text": "HELLO"}', call_id="c1"), tool_call("echo", '{"text": "my secret"}', call_id="c2"),
        reply("done"),
    ), toolset_of(echo))
    await execute_run(1, ports=fake.ports)
    store = fake.store
    assert store.status == RunStatus.COMPLETED and echo.calls == 1  # the blocked call never ran
    rewritten, blocked = store.calls.values()
    assert (rewritten["status"], rewritten["result"]) == (ToolCallStatus.SUCCEEDED, "echo: hello")
    assert (blocked["status"], blocked["error"]) == (ToolCallStatus.FAILED, "Blocked by the guardrail: no secrets.")
    assert fake.model_.prompts[1][-1].content == "echo: hello"
    assert fake.model_.prompts[2][-1].content == "Error: Blocked by the guardrail: no secrets."
    assert fake.types() == ["run_running", "tool_call_started", "tool_call_succeeded", "tool_call_started",
                            "tool_call_failed", "run_completed"]


async def test_without_the_registration_the_same_calls_run_unchanged():
    echo = EchoTool()
    fake = FakePorts(MemoryRunStore(run_spec()), ScriptedModel(tool_call("echo", '{"text": "my SECRET"}'), reply("ok")),
                     toolset_of(echo))
    await execute_run(1, ports=fake.ports)
    [call] = fake.store.calls.values()
    assert (call["status"], call["result"], echo.calls) == (ToolCallStatus.SUCCEEDED, "echo: my SECRET", 1)


async def test_a_registered_wrapper_comes_after_the_approval_policy(monkeypatch):
    """The guardrail is registered after the approval policy: a call under ``ask`` waits for a
    human first; once approved, the guardrail blocks it."""
    _register(monkeypatch)
    echo = EchoTool()
    fake = FakePorts(MemoryRunStore(run_spec()), ScriptedModel(tool_call("echo", '{"text": "a secret"}'), reply("ok")),
                     toolset_of(echo, ask=("echo",)))
    await execute_run(1, ports=fake.ports)
    assert fake.store.status == RunStatus.AWAITING_APPROVAL
    (pk,) = fake.store.calls
    fake.store.approve(pk)
    await execute_run(1, ports=fake.ports)
    assert fake.store.status == RunStatus.COMPLETED and echo.calls == 0
    assert fake.store.calls[pk]["error"] == "Blocked by the guardrail: no secrets."


class BigTool(Tool):
    """Returns ``ARTIFACT_MIN_CHARS + 1000`` characters of plain text."""

    spec = ToolSpec(name="big", description="A large result.")

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content="x" * (ARTIFACT_MIN_CHARS + 1000))


async def test_a_result_too_large_for_the_model_is_stored_through_the_ports_tool_store():
    fake = FakePorts(MemoryRunStore(run_spec()), ScriptedModel(tool_call("big"), reply("ok")), toolset_of(BigTool()))
    await execute_run(1, ports=fake.ports)
    [(artifact_id, (session_id, name, mime_type, data))] = fake.tool_store.artifacts.items()
    (pk,) = fake.store.calls
    assert (session_id, name, mime_type) == (1, f"big-{pk}.txt", "text/plain")
    assert data == b"x" * (ARTIFACT_MIN_CHARS + 1000)
    assert f"artifact:{artifact_id}" in fake.model_.prompts[1][-1].content
    assert "read_artifact" in [t.name for t in fake.model_.offered[1]]  # offered from the next turn on
    assert ("artifact_updated", {"artifact_id": artifact_id, "name": name, "mime_type": "text/plain",
                                 "size_bytes": len(data), "tool_call_id": pk}) in fake.events


# --- through the production ports ---------------------------------------------------------------


@sync_to_async
def _agent_with_echo(world, url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    bind_builtin(agent, "test_echo")
    return agent


@sync_to_async
def _calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue", "all_tenants_scope")
async def test_registered_wrappers_apply_to_a_run_through_the_production_ports(world, fake_llm, monkeypatch):
    _register(monkeypatch)
    agent = await _agent_with_echo(world, fake_llm.base_url)
    fake_llm.script(ToolCalls([("test_echo", {"text": "LOUD"}), ("test_echo", {"text": "the secret"})]), Reply("ok"))
    run = await post_message(agent=agent, user=world.member, content="echo twice")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    rewritten, blocked = await _calls(run.pk)
    assert (rewritten.status, rewritten.result) == ("succeeded", "echo: loud")
    assert (blocked.status, blocked.error) == ("failed", "Blocked by the guardrail: no secrets.")
    tool_messages = [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages == ["echo: loud", "Error: Blocked by the guardrail: no secrets."]
