"""In-memory fakes of the runner's ports (:mod:`sessions.runner.ports`): a run store, a
publisher, a scripted model, a toolset opener, a cancel switch and a tool store. No database, no Redis, no
model server: the loop's orchestration (:func:`sessions.runner.loop.execute_run`) runs over them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from types import SimpleNamespace
from typing import Any

from capabilities.tests.memory_store import MemoryToolStore
from capabilities.tools import Tool, ToolContext, ToolResult
from capabilities.toolsets import ToolOrigin
from llm.types import IMAGE_MIME_TYPES, ChatMessage, Completion, TextDelta, ToolCallRequest, ToolSpec, Usage
from sessions import runs
from sessions.event_types import validate_event
from sessions.models import ApprovalStatus, RunStatus, ToolCallStatus
from sessions.runner.database import ApprovalState, History
from sessions.runner.ports import ArtifactImage, CallbackPublisher, RunPorts
from sessions.runner.spec import RunSpec
from sessions.runner.toolset import Toolset
from sessions.runs.records import elicitation_public

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


@dataclasses.dataclass
class MemorySubRun:
    """A skill's sub-run in a :class:`MemoryRunStore`."""

    run_id: int
    parent_call_pk: int
    skill_id: int
    task: str
    status: str = RunStatus.RUNNING
    attempt: int = 1
    outcome: Any = None
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class MemoryRunStore:
    """One user's run's rows (and its skills' sub-runs') in memory, with the production store's
    semantics the loop relies on: a claim moves queued → running (attempt + 1), a call's
    result is recorded once, the history's ``tail`` is the run's last assistant message when
    only its results follow and it has calls without a result (or is the last message).

    Like :class:`sessions.runner.adapters.DatabaseRunStore`, each write clients see publishes
    its own event through the ``publish`` it is given, after the write (the same names and
    payloads, from :mod:`sessions.runs`' own event builders); the store itself publishes only
    what the production claim does without a publisher (``run_running``, into ``events``)."""

    def __init__(self, spec: RunSpec, *, user_message: str = "hello", events: list | None = None) -> None:
        self.spec = spec
        self.status = RunStatus.QUEUED
        self.outcome: Any = None
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": user_message}]
        self.calls: dict[int, dict[str, Any]] = {}
        self.approvals: dict[int, ApprovalState] = {}
        self._approval_items: dict[int, dict[str, Any]] = {}
        self.subruns: dict[int, MemorySubRun] = {}
        """``{run id: sub-run}``; ids from 1001."""
        self.events = events if events is not None else []
        self.llm_calls: list[Any] = []
        self.llm_call_purposes: list[str] = []
        """The ``purpose`` of each ``llm_calls`` entry, in order."""
        self.compactions: list[dict[str, Any]] = []
        self.completed_hooks = 0
        self.artifacts: dict[int, tuple[int, str, bytes]] = {}
        """``{artifact id: (session id, mime type, content)}``: what ``images_load`` reads."""
        self.context: list[Any] | None = None
        """The run's stored start context (JSON blocks; None: none stored yet)."""
        self.attributions: list[dict[str, Any]] | None = None
        self.route_choices: list[dict[str, Any]] = []
        """What ``route_choice_save`` recorded (``Run.routing``)."""
        self.structured: Any = None
        """What ``structured_save`` stored (``Run.structured``)."""
        self._pks = itertools.count(1)
        self._subrun_ids = itertools.count(1001)

    def _messages_of(self, run_id: int) -> list[dict[str, Any]]:
        return self.subruns[run_id].messages if run_id in self.subruns else self.messages

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

    def _pending_items(self, *, sub_run_id: int | None = None) -> list[dict[str, Any]]:
        return [item for pk, item in self._approval_items.items()
                if self.approvals[pk].status == ApprovalStatus.PENDING
                and (sub_run_id is None or item["sub_run_id"] == sub_run_id)]

    async def pause(self, run_id: int, *, publish: Any) -> bool:
        pending = self._pending_items()
        if not pending:  # decided meanwhile: queued again, no event
            self.status = RunStatus.QUEUED
            return False
        self.status = RunStatus.AWAITING_APPROVAL
        await publish("run_awaiting_approval", {"approvals": pending})
        return True

    async def finish(self, run_id: int, outcome: Any, *, publish: Any, spec: Any) -> Any:
        if self.status != RunStatus.RUNNING:
            return SimpleNamespace(ended=False)
        self.status, self.outcome = outcome.status, outcome
        for call in self.calls.values():  # calls left without a result
            if call["status"] not in _FINISHED:
                call["status"] = ToolCallStatus.CANCELLED
        await publish(*runs.end_event(outcome))
        return SimpleNamespace(ended=True)

    async def after_completed(self, spec: RunSpec) -> None:
        self.completed_hooks += 1

    # reads
    async def history(self, run_id: int, *, session_id: int, subrun: bool, compaction: Any = None) -> History:
        out: list[ChatMessage] = []
        for m in self._messages_of(run_id):
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
        by_id = {c["call_id"]: (pk, c) for pk, c in self.calls.items()
                 if c["status"] not in _FINISHED and c["run_id"] == run_id}
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

    async def images_load(self, *, session_id: int, artifact_ids: list[int], max_bytes: int) -> list[ArtifactImage]:
        return [ArtifactImage(pk, mime_type, len(content),
                              content if mime_type in IMAGE_MIME_TYPES and len(content) <= max_bytes else None)
                for pk, (owner, mime_type, content) in sorted(self.artifacts.items())
                if owner == session_id and pk in artifact_ids]

    async def run_context_load(self, run_id: int) -> tuple[list[Any] | None, str]:
        return self.context, self.messages[0]["content"]

    async def run_context_save(self, run_id: int, blocks: list[dict[str, Any]]) -> None:
        if self.context is None:
            self.context = blocks

    async def tool_results(self, run_id: int) -> list[tuple[str, Any]]:
        return [(c["name"], c["data"]) for c in self.calls.values()
                if c["run_id"] == run_id and c["status"] == ToolCallStatus.SUCCEEDED and c.get("data") is not None]

    async def attributions_save(self, run_id: int, attributions: list[dict[str, Any]]) -> None:
        self.attributions = attributions

    async def route_choice_save(self, run_id: int, *, turn: int, rule: str, route: str) -> None:
        self.route_choices.append({"turn": turn, "rule": rule, "route": route})

    async def structured_save(self, run_id: int, value: Any) -> None:
        self.structured = value

    # writes
    async def assistant_message_save(self, *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str = "",
                                     llm_call: Any = None) -> list[dict[str, Any]]:
        self._messages_of(spec.run_id).append({"role": "assistant", "content": message.content,
                                               "tool_calls": message.tool_calls, "turn": turn})
        saved = []
        for c in message.tool_calls:
            pk = next(self._pks)
            self.calls[pk] = {"call_id": c.id, "name": c.name, "arguments_raw": c.arguments,
                              "status": ToolCallStatus.PENDING, "run_id": spec.run_id}
            saved.append({"pk": pk, "call_id": c.id, "name": c.name, "arguments_raw": c.arguments})
        return saved

    async def llm_call_record(self, *, spec: RunSpec, turn: int, record: Any, purpose: str = "turn") -> None:
        self.llm_calls.append((turn, record))
        self.llm_call_purposes.append(purpose)

    async def tool_call_start(self, *, pk: int, name: str, arguments: Any, publish: Any) -> None:
        self.calls[pk]["status"] = ToolCallStatus.RUNNING
        await publish("tool_call_started", {"tool_call_id": pk, "name": name, "arguments": arguments})

    async def tool_call_finish(self, *, spec: RunSpec, pk: int, name: str, status: str, content: str, data: Any,
                               error: str, duration_ms: int, publish: Any, model_content: str | None = None) -> bool:
        call = self.calls[pk]
        if call["status"] in _FINISHED:
            return False
        call.update(status=status, result=content, error=error, data=data)
        text = model_content if model_content is not None else (
            content if status == ToolCallStatus.SUCCEEDED else f"Error: {error}")
        self._messages_of(call["run_id"]).append({"role": "tool", "content": text, "tool_call_id": call["call_id"],
                                                  "name": call["name"]})
        await publish(*runs.tool_call_finished_event(pk=pk, name=name, status=status, content=content, data=data,
                                                     error=error, duration_ms=duration_ms))
        return True

    async def approval_request(self, *, spec: RunSpec, call_pk: int, kind: str, tool_name: str, arguments: Any,
                               reason: str = "", question: str = "", elicitation: Any = None,
                               rule: Any = None) -> int:
        approval_id = 100 + call_pk
        self.approvals[call_pk] = ApprovalState(approval_id=approval_id, kind=kind, status=ApprovalStatus.PENDING,
                                                answer="", elicitation=elicitation)
        sub = self.subruns.get(spec.run_id)
        self._approval_items[call_pk] = {
            "approval_id": approval_id, "tool_call_id": call_pk, "kind": kind, "status": "pending",
            "tool_name": tool_name, "arguments": arguments, "reason": reason, "question": question,
            "elicitation": elicitation_public(elicitation),
            "expires_at": "2100-01-01T00:00:00+00:00", "sub_run_id": sub.run_id if sub else None,
            "skill": f"skill-{sub.skill_id}" if sub else None,
            "approvers": {}, "on_timeout": str((rule or {}).get("on_timeout") or ""),
        }
        self.calls[call_pk]["status"] = ToolCallStatus.AWAITING_APPROVAL
        return approval_id

    async def compaction_begin(self, *, attempt: int, tokens_before: int, messages: int, publish: Any) -> None:
        await publish("compaction_running", {"attempt": attempt, "tokens_before": tokens_before, "messages": messages})

    async def compaction_save(self, *, spec: RunSpec, attempt: int, status: str, publish: Any, **fields: Any) -> int:
        self.compactions.append({"attempt": attempt, "status": status, **fields})
        compaction_id = len(self.compactions)
        await publish("compaction_completed", runs.compaction_completed_event(
            compaction_id=compaction_id, attempt=attempt, status=status, tokens_before=fields.get("tokens_before", 0),
            tokens_after=fields.get("tokens_after", 0), messages_summarized=fields.get("messages_summarized", 0),
            error=fields.get("error", ""),
        ))
        return compaction_id

    # sub-runs
    async def subrun_open(self, *, parent: RunSpec, call_pk: int, skill_id: int, skill_name: str, task: str,
                          publisher: Any) -> runs.SubRunState:
        existing = next((r for r in self.subruns.values() if r.parent_call_pk == call_pk), None)
        if existing is not None:
            if existing.status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
                existing.status, existing.attempt = RunStatus.RUNNING, existing.attempt + 1
            sub = existing
        else:
            sub = MemorySubRun(run_id=next(self._subrun_ids), parent_call_pk=call_pk, skill_id=skill_id, task=task,
                               messages=[{"role": "user", "content": task}])
            self.subruns[sub.run_id] = sub
        if sub.status == RunStatus.RUNNING:
            await publisher(sub.run_id)("run_running", {"attempt": sub.attempt, "skill": skill_name,
                                                        "depth": parent.depth + 1, "task": task})
        outcome = sub.outcome
        return runs.SubRunState(run_id=sub.run_id, status=sub.status, reply=outcome.reply if outcome else "",
                                error=outcome.error if outcome else "", created=existing is None, attempt=sub.attempt)

    async def subrun_spec(self, *, subrun_id: int, parent: RunSpec) -> RunSpec:
        sub = self.subruns[subrun_id]
        return dataclasses.replace(parent, run_id=subrun_id, system_prompt=f"skill {sub.skill_id}", bindings=(),
                                   depth=parent.depth + 1, parent_run_id=parent.run_id,
                                   user_run_id=parent.waiting_run_id, attempt=sub.attempt, loop_count=0)

    async def subrun_pause(self, *, run_id: int, attempt: int, call_pk: int, publish: Any) -> bool:
        sub = self.subruns[run_id]
        if sub.status != RunStatus.RUNNING or sub.attempt != attempt:
            return False
        sub.status = RunStatus.AWAITING_APPROVAL
        self.calls[call_pk]["status"] = ToolCallStatus.AWAITING_APPROVAL
        await publish("run_awaiting_approval", {"approvals": self._pending_items(sub_run_id=run_id)})
        return True

    async def subrun_finish(self, run_id: int, ending: Any, *, publish: Any, attempt: int | None = None) -> bool:
        sub = self.subruns[run_id]
        if sub.status not in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL) or (
            attempt is not None and sub.attempt != attempt
        ):
            return False
        sub.status, sub.outcome = ending.status, ending
        await publish(*runs.end_event(ending))
        return True

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
        self.settings: list[dict[str, Any]] = []
        """Each call's other keyword arguments (``tool_choice``, ``response_format``) when given."""

    async def stream(self, messages: Any, tools: Any, *, compact_first: bool = False, **settings: Any) -> Any:
        self.prompts.append(list(messages))
        self.offered.append(list(tools))
        self.settings.append(settings)
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
    published, in order; ``cancel``: request a cancel of the run; ``tool_store``: the
    artifacts and todos the run's tools stored (a :class:`MemoryToolStore`)."""

    def __init__(self, store: MemoryRunStore, model: ScriptedModel, toolset: Toolset | None = None) -> None:
        self.store, self.model_ = store, model
        self.events = store.events
        self.toolset = toolset or Toolset()
        self.opened = 0
        self._cancel = asyncio.Event()
        self.tool_store = MemoryToolStore()
        self.ports = RunPorts(store=store, publisher=self._publisher, model=lambda spec, record, publish: model,
                              toolsets=self._open, cancel_watch=self._watch, tool_store=self.tool_store)

    def _publisher(self, session_id: int, run_id: int) -> Any:
        """The run's publisher: each event checked against its payload class (the fakes publish
        what production does), then noted as ``(type, data)``, or ``(type, data, run_id)`` for
        another run than the store's own (a sub-run)."""
        own = run_id == self.store.spec.run_id

        async def publish(event_type: str, data: dict[str, Any]) -> None:
            validate_event(event_type, data)
            self.events.append((event_type, data) if own else (event_type, data, run_id))

        return CallbackPublisher(publish)

    async def _open(self, spec: RunSpec, stack: contextlib.AsyncExitStack, publish: Any) -> tuple[Toolset, tuple]:
        self.opened += 1
        return self.toolset, ()

    async def _watch(self, run_id: int) -> None:
        await self._cancel.wait()

    def cancel(self) -> None:
        self._cancel.set()

    def types(self) -> list[str]:
        """The event types published for the store's own run, tokens left out."""
        return [e[0] for e in self.events if len(e) == 2 and e[0] not in ("content_token", "reasoning_token")]
