"""In-memory fakes of the runner's ports (:mod:`sessions.runner.ports`): a run store, a
publisher, a scripted model, a toolset opener and a cancel switch. No database, no Redis, no
model server: the loop's orchestration (:func:`sessions.runner.loop.execute_run`) runs over them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from types import SimpleNamespace
from typing import Any

from capabilities.tools import Tool, ToolContext, ToolResult
from capabilities.toolsets import ToolOrigin
from llm.types import ChatMessage, Completion, TextDelta, ToolCallRequest, ToolSpec, Usage
from sessions import runs
from sessions.models import ApprovalStatus, RunStatus, ToolCallStatus
from sessions.runner._db import ApprovalState, History
from sessions.runner.ports import RunPorts
from sessions.runner.spec import RunSpec
from sessions.runner.toolset import Toolset

_FINISHED = {ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED, ToolCallStatus.TIMED_OUT, ToolCallStatus.CANCELLED}


def run_spec(**overrides: Any) -> RunSpec:
    """A RunSpec for run 1 of session 1 in tenant 1, one route entry with a large window."""
    entry = SimpleNamespace(max_input_tokens=100_000, input_price_per_mtok=0, supports_images=False)
    values: dict[str, Any] = dict(
        run_id=1, tenant_id=1, session_id=1, user_id=1, agent_name="agent", system_prompt="", max_loop_count=10,
        tool_max_parallel=4, tool_timeout_seconds=5.0, turn_timeout_seconds=5.0, max_tokens_per_run=None,
        max_cost_per_run_usd_micros=None, tenant_monthly_budget_usd_micros=None, entries=(entry,), entry_ids=(1,),
        run_started_at=time.time(), attempt=0,  # queued, never claimed
    )
    values.update(overrides)
    return RunSpec(**values)


class MemoryRunStore:
    """One run's rows in memory, with the production store's semantics the loop relies on:
    a claim moves queued → running (attempt + 1), a call's result is recorded once, the
    history's ``tail`` is this run's last assistant message when only its results follow and
    it has calls without a result (or is the last message)."""

    def __init__(self, spec: RunSpec, *, user_message: str = "hello", events: list | None = None) -> None:
        self.spec = spec
        self.status = RunStatus.QUEUED
        self.outcome: Any = None
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": user_message}]
        self.calls: dict[int, dict[str, Any]] = {}
        self.approvals: dict[int, ApprovalState] = {}
        self.events = events if events is not None else []
        self.llm_calls: list[Any] = []
        self.compactions: list[dict[str, Any]] = []
        self.completed_hooks = 0
        self._pks = itertools.count(1)

    # lifecycle
    async def tenant_of(self, run_id: int) -> int | None:
        return self.spec.tenant_id if run_id == self.spec.run_id else None

    async def claim(self, run_id: int) -> RunSpec:
        if self.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            raise runs.RunNotClaimable(f"run {run_id} is {self.status}")
        self.status = RunStatus.RUNNING
        self.spec = dataclasses.replace(self.spec, attempt=self.spec.attempt + 1)
        self.events.append(("run_running", {"attempt": self.spec.attempt}))
        return self.spec

    async def session_of(self, run_id: int) -> int:
        return self.spec.session_id

    async def heartbeat(self, run_id: int, attempt: int) -> bool:
        return self.status == RunStatus.RUNNING

    async def pause(self, run_id: int, *, publish: Any) -> bool:
        self.status = RunStatus.AWAITING_APPROVAL
        await publish("run_awaiting_approval", {})
        return True

    async def finish(self, run_id: int, outcome: Any, *, publish: Any, spec: Any) -> Any:
        if self.status != RunStatus.RUNNING:
            return SimpleNamespace(ended=False)
        self.status, self.outcome = outcome.status, outcome
        for call in self.calls.values():  # calls left without a result
            if call["status"] not in _FINISHED:
                call["status"] = ToolCallStatus.CANCELLED
        await publish(f"run_{outcome.status}", {"reply": outcome.reply, "error": outcome.error,
                                                "reason": outcome.reason})
        return SimpleNamespace(ended=True)

    async def after_completed(self, spec: RunSpec) -> None:
        self.completed_hooks += 1

    # reads
    async def history(self, run_id: int, *, session_id: int, subrun: bool, compaction: Any = None) -> History:
        out: list[ChatMessage] = []
        for m in self.messages:
            if m["role"] == "assistant":
                out.append(ChatMessage(role="assistant", content=m["content"], tool_calls=m["tool_calls"]))
            elif m["role"] == "tool":
                out.append(ChatMessage(role="tool", content=m["content"], tool_call_id=m["tool_call_id"],
                                       name=m["name"]))
            else:
                out.append(ChatMessage(role="user", content=m["content"]))
        answered = {m.tool_call_id for m in out if m.role == "tool"}
        last = len(out) - 1
        while last >= 0 and out[last].role == "tool":
            last -= 1
        tail = None
        if last >= 0 and out[last].role == "assistant" and (
            last == len(out) - 1 or any(c.id not in answered for c in out[last].tool_calls)
        ):
            tail = out[last]
        return History(messages=out, tail=tail, summary="", rows=[], compaction=None)

    async def pending_tool_calls(self, *, run_id: int, call_ids: list[str]) -> list[dict[str, Any]]:
        by_id = {c["call_id"]: (pk, c) for pk, c in self.calls.items() if c["status"] not in _FINISHED}
        return [{"pk": by_id[i][0], "call_id": i, "name": by_id[i][1]["name"],
                 "arguments_raw": by_id[i][1]["arguments_raw"]} for i in call_ids if i in by_id]

    async def approvals_for_calls(self, *, call_pks: list[int]) -> dict[int, ApprovalState]:
        return {pk: a for pk, a in self.approvals.items() if pk in call_pks}

    async def steer_absorb(self, run_id: int) -> list[int]:
        return []

    async def usage(self, run_id: int) -> Any:
        return SimpleNamespace(tokens=0, cost_usd_micros=0)

    async def tenant_month_cost_usd_micros(self, tenant_id: int) -> int:
        return 0

    async def has_artifacts(self, session_id: int) -> bool:
        return False

    # writes
    async def assistant_message_save(self, *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str = "",
                                     llm_call: Any = None) -> list[dict[str, Any]]:
        self.messages.append({"role": "assistant", "content": message.content, "tool_calls": message.tool_calls,
                              "turn": turn})
        saved = []
        for c in message.tool_calls:
            pk = next(self._pks)
            self.calls[pk] = {"call_id": c.id, "name": c.name, "arguments_raw": c.arguments,
                              "status": ToolCallStatus.PENDING}
            saved.append({"pk": pk, "call_id": c.id, "name": c.name, "arguments_raw": c.arguments})
        return saved

    async def llm_call_record(self, *, spec: RunSpec, turn: int, record: Any) -> None:
        self.llm_calls.append((turn, record))

    async def tool_call_start(self, *, pk: int) -> None:
        self.calls[pk]["status"] = ToolCallStatus.RUNNING

    async def tool_call_finish(self, *, spec: RunSpec, pk: int, status: str, content: str, data: Any, error: str,
                               duration_ms: int, model_content: str | None = None) -> bool:
        call = self.calls[pk]
        if call["status"] in _FINISHED:
            return False
        call.update(status=status, result=content, error=error)
        text = model_content if model_content is not None else (
            content if status == ToolCallStatus.SUCCEEDED else f"Error: {error}")
        self.messages.append({"role": "tool", "content": text, "tool_call_id": call["call_id"], "name": call["name"]})
        return True

    async def approval_request(self, *, spec: RunSpec, call_pk: int, kind: str, tool_name: str, arguments: Any,
                               reason: str = "", question: str = "") -> int:
        approval_id = 100 + call_pk
        self.approvals[call_pk] = ApprovalState(approval_id=approval_id, kind=kind, status=ApprovalStatus.PENDING,
                                                answer="")
        self.calls[call_pk]["status"] = ToolCallStatus.AWAITING_APPROVAL
        self.events.append(("approval_requested", {"approval_id": approval_id, "tool_name": tool_name}))
        return approval_id

    async def compaction_save(self, *, spec: RunSpec, attempt: int, status: str, **fields: Any) -> int:
        self.compactions.append({"attempt": attempt, "status": status, **fields})
        return len(self.compactions)

    # what a human does between a pause and the run's resumption
    def approve(self, call_pk: int) -> None:
        self.approvals[call_pk] = ApprovalState(approval_id=100 + call_pk, kind="tool_call",
                                                status=ApprovalStatus.APPROVED, answer="")
        self.status = RunStatus.QUEUED


class ScriptedModel:
    """A model that plays its script, one item per model turn: a ChatMessage (streamed as its
    text, then its Completion), an exception (raised), or an ``asyncio.Event`` (the turn
    streams ``"partial "`` and then waits for it: a turn a cancel interrupts)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.prompts: list[list[ChatMessage]] = []
        self.offered: list[list[ToolSpec]] = []

    async def stream(self, messages: Any, tools: Any, *, compact_first: bool = False) -> Any:
        self.prompts.append(list(messages))
        self.offered.append(list(tools))
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, asyncio.Event):
            yield TextDelta("partial ")
            await item.wait()
            return
        if item.content:
            yield TextDelta(item.content)
        yield Completion(message=item, usage=Usage(), finish_reason="stop", entry_index=0, model="m")

    async def complete(self, messages: Any, tools: Any, **kwargs: Any) -> Completion:
        raise AssertionError("no compaction expected")


def reply(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def tool_call(name: str, arguments: str = "{}", *, call_id: str = "c1") -> ChatMessage:
    return ChatMessage(role="assistant", content="", tool_calls=(ToolCallRequest(id=call_id, name=name,
                                                                                arguments=arguments),))


class EchoTool(Tool):
    """Returns its ``text`` argument; counts its calls."""

    def __init__(self, name: str = "echo") -> None:
        self.spec = ToolSpec(name=name, description="Echo the text.")
        self.calls = 0

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        self.calls += 1
        return ToolResult(content=f"echo: {arguments.get('text', '')}")


def toolset_of(*tools: Tool, ask: tuple[str, ...] = ()) -> Toolset:
    """A Toolset of ``tools``; those named in ``ask`` are under an approval policy that asks."""
    toolset = Toolset()
    for tool in tools:
        name = tool.spec.name
        toolset.tools[name] = tool
        policy = ({"pattern": name, "action": "ask"},) if name in ask else ()
        toolset.origins[name] = ToolOrigin(source="test", name=name, binding_id=1, approval_policy=policy)
    return toolset


class FakePorts:
    """The ports over the fakes: ``ports`` to pass to ``execute_run``; ``events``: what was
    published, in order; ``cancel``: request a cancel of the run."""

    def __init__(self, store: MemoryRunStore, model: ScriptedModel, toolset: Toolset | None = None) -> None:
        self.store, self.model_ = store, model
        self.events = store.events
        self.toolset = toolset or Toolset()
        self.opened = 0
        self._cancel = asyncio.Event()
        self.ports = RunPorts(store=store, publisher=self._publisher, model=lambda spec, record, publish: model,
                              toolsets=self._open, cancel_watch=self._watch)

    def _publisher(self, session_id: int, run_id: int) -> Any:
        async def publish(event_type: str, data: dict[str, Any]) -> None:
            self.events.append((event_type, data))

        return publish

    async def _open(self, spec: RunSpec, stack: contextlib.AsyncExitStack, publish: Any) -> tuple[Toolset, tuple]:
        self.opened += 1
        return self.toolset, ()

    async def _watch(self, run_id: int) -> None:
        await self._cancel.wait()

    def cancel(self) -> None:
        self._cancel.set()

    def types(self) -> list[str]:
        return [t for t, _ in self.events if t not in ("content_token", "reasoning_token")]
