"""The agent's guardrails applied to a run (issue 39, "Guardrails"; the checks: :mod:`guardrails.checks`).

Four points, each the agent's guardrails of that point in their order (``RunSpec.guardrails``):

- **input**: the user's message, before the run's first model call (:func:`guard_input`);
- **tool call**: a call's arguments, before the tool runs (:class:`GuardrailCallToolset`, an
  interceptor after the approval policy): blocked, or its arguments rewritten (``mask``);
- **tool result**: the tool's result, before the model reads it (:class:`GuardrailResultToolset`,
  an interceptor inside the output wrapper): blocked, or masked (not a trip: the call's stored
  result is the masked text, which the trace shows);
- **output**: the answer, before it is saved as final (:func:`guard_output`). Its text was
  streamed already: the trip's event says ``retracted`` and the chat app replaces it.

A trip publishes ``guardrail_tripped``, writes an audit record (action ``guardrail_tripped``) and
ends the run ``failed`` with reason ``guardrail_tripped`` and the guardrail's plain-language
message: :class:`GuardrailStop` is raised out of the turn's steps and
:func:`sessions.runner.loop._run_loop` turns it into the run's end. A blocked tool call (or
result) fails the call with that message first; the run ends when the turn's calls are done
(:func:`guard_tripped`). A guardrail that cannot run follows its ``on_error`` policy (fail closed
by default). A model check asks its route through :class:`llm.metering.MeteredRoute`: its LLM
calls are recorded with purpose ``guardrail`` (agent and user of the run).

The run's guard lives in a ContextVar (:data:`current_guard`), set by :func:`run_guarded` for
the run's loop: the interceptors and a skill's sub-run (which sets its own, without
guardrails) read it. A run without guardrails pays one ContextVar read per tool call and per
model turn.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from capabilities.toolsets import SUCCEEDED, ToolInvocation, ToolOutcome, WrapperToolset
from guardrails.checks import GuardrailSpec, Verdict, check, user_message
from guardrails.models import GuardrailAction, GuardrailPoint
from sessions.models import RunFailureReason
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db

logger = logging.getLogger(__name__)

AUDIT_ACTION = "guardrail_tripped"
"""The audit log's action of a trip."""

TRIPPED_CODE = "guardrail_tripped"
"""The failed tool call's code (a blocked call or result)."""


class GuardrailStop(Exception):
    """A guardrail tripped: the run ends failed, reason ``guardrail_tripped``, with :attr:`error`
    (the message members read), raised out of the turn's steps."""

    reason = RunFailureReason.GUARDRAIL_TRIPPED

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass(slots=True)
class RunGuard:
    """The guardrails of one run, by point, and what they did so far."""

    spec: RunSpec
    publish: Any
    by_point: dict[str, tuple[GuardrailSpec, ...]]
    input_checked: bool = False
    tripped: str | None = None
    """The run's error once a guardrail tripped (its message), else None."""
    masked: list[dict[str, Any]] = field(default_factory=list)
    """``{guardrail, point, masks, tool_call_id}`` per masking (logged; the call's stored result shows it)."""

    def of(self, point: str) -> tuple[GuardrailSpec, ...]:
        return self.by_point.get(point, ())

    async def apply(self, point: str, text: str, *, retracted: bool = False,
                    tool_call_id: int | None = None) -> tuple[str, Any]:
        """Run the guardrails of ``point`` on ``text`` in order.

        Returns:
            ``(text, None)``: passed (``text`` masked where a ``mask`` guardrail matched), or
            ``(text, error)``: the first that tripped (its message); it was published and audited.
        """
        for guardrail in self.of(point):
            verdict = await check(guardrail, text, ask=_ask_for(self.spec))
            if verdict.error and not verdict.tripped:
                logger.warning("run %s: guardrail %r could not run and fails open: %s", self.spec.run_id,
                               guardrail.name, verdict.error)
            if verdict.tripped:
                return text, await self.trip(guardrail, verdict, retracted=retracted, tool_call_id=tool_call_id)
            if verdict.masked is not None:
                text = verdict.masked
                self.masked.append({"guardrail": guardrail.name, "point": point, "masks": verdict.masks,
                                    "tool_call_id": tool_call_id})
                logger.info("run %s: guardrail %r masked %s match(es) (%s)", self.spec.run_id, guardrail.name,
                            verdict.masks, verdict.reason)
        return text, None

    async def trip(self, guardrail: GuardrailSpec, verdict: Verdict, *, retracted: bool,
                   tool_call_id: int | None) -> str:
        """Record that ``guardrail`` tripped (event, audit record); returns the run's error."""
        message = user_message(guardrail)
        error = message if not guardrail.message else f"{message} (guardrail “{guardrail.name}”)"
        if self.tripped is None:
            self.tripped = error
        await self.publish("guardrail_tripped", {"guardrail": guardrail.name, "point": guardrail.point,
                                                 "kind": guardrail.kind, "message": error, "retracted": retracted})
        detail = {"guardrail": guardrail.name, "point": guardrail.point, "kind": guardrail.kind,
                  "reason": verdict.reason[:500], "agent_id": self.spec.agent_id, "run_id": self.spec.run_id,
                  "tool_call_id": tool_call_id, "retracted": retracted}
        try:
            await audit_write(tenant_id=self.spec.tenant_id, run_id=self.spec.run_id, detail=detail)
        except Exception:  # noqa: BLE001 - the run still ends failed; the log says the audit row is missing
            logger.exception("run %s: the audit record of guardrail %r could not be written", self.spec.run_id,
                             guardrail.name)
        logger.info("run %s: guardrail %r tripped at %s: %s", self.spec.run_id, guardrail.name, guardrail.point,
                    verdict.reason)
        return error


def _audit_write_sync(*, tenant_id: int, run_id: int, detail: dict[str, Any]) -> None:
    from tenants.audit import audit_record

    audit_record(action=AUDIT_ACTION, tenant_id=tenant_id, object_type="agent_sessions.run", object_id=run_id,
                 object_repr=f"run {run_id}", detail=detail, source="system")


async def audit_write(*, tenant_id: int, run_id: int, detail: dict[str, Any]) -> None:
    """Write a trip's audit record (on a database thread; tests of the in-memory ports replace it)."""
    await db(_audit_write_sync)(tenant_id=tenant_id, run_id=run_id, detail=detail)


def _route_configs(tenant_id: int, route_id: int | None, route_name: str | None) -> tuple[list[Any], list[int]]:
    """The entries (router configs) and entry ids of the tenant's route ``route_id`` (else named ``route_name``)."""
    from llm.models import ModelRoute
    from llm.selectors import route_entries, route_entry_config
    from tenants.models import Tenant

    routes = ModelRoute.all_tenants.filter(tenant_id=tenant_id)
    route = routes.filter(pk=route_id).first() if route_id is not None else routes.filter(name=route_name).first()
    if route is None:
        raise LookupError("the guardrail's model route does not exist")
    tenant = Tenant.objects.get(pk=tenant_id)
    entries = [e for e in route_entries(route_id=route.pk) if e.provider.tenant_id == tenant_id]
    if not entries:
        raise LookupError("the guardrail's model route has no entries")
    return [route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries)], [e.pk for e in entries]


def _ask_for(spec: RunSpec) -> Any:
    """The model check's ``ask`` for run ``spec``: the guardrail's route through a metered route
    (purpose ``guardrail``, the run's agent and user); raises when the route fails."""

    async def ask(guardrail: GuardrailSpec, messages: list[dict[str, str]]) -> str:
        from llm.metering import CallSite, LLMCallPurpose, MeteredRoute
        from llm.types import ChatMessage

        configs, entry_ids = await db(_route_configs)(spec.tenant_id, guardrail.route_id, guardrail.route)
        site = CallSite(tenant_id=spec.tenant_id, purpose=LLMCallPurpose.GUARDRAIL.value, entry_ids=tuple(entry_ids),
                        agent_id=spec.agent_id, user_id=spec.user_id)
        route = MeteredRoute(configs, site)
        completion = await route.complete([ChatMessage(role=m["role"], content=m["content"]) for m in messages],
                                          in_thread=db, max_output_tokens=200)
        return completion.message.content

    return ask


current_guard: contextvars.ContextVar[RunGuard | None] = contextvars.ContextVar("run_guard", default=None)
"""The guard of the run whose loop runs in this context (None: the run has no guardrails)."""


@contextlib.contextmanager
def run_guarded(spec: RunSpec, publish: Any) -> Iterator[RunGuard | None]:
    """Inside: the run ``spec``'s guard is :data:`current_guard` (None when it has no guardrails)."""
    guard = None
    if spec.guardrails:
        by_point: dict[str, list[GuardrailSpec]] = {}
        for guardrail in spec.guardrails:
            by_point.setdefault(guardrail.point, []).append(guardrail)
        guard = RunGuard(spec=spec, publish=publish, by_point={k: tuple(v) for k, v in by_point.items()})
    token = current_guard.set(guard)
    try:
        yield guard
    finally:
        current_guard.reset(token)


def _input_text(state: Any) -> str:
    """The run's input: the user messages at the end of its history (after the last answer or tool result)."""
    texts: list[str] = []
    for message in reversed(state.history.messages if state.history is not None else ()):
        if message.role != "user":
            break
        texts.append(message.content)
    return "\n\n".join(reversed(texts))


async def guard_input(state: Any) -> None:
    """Before a model turn: the input guardrails, once per run attempt, before its first model
    call (a run resumed after its first answer is not checked again).

    Raises:
        GuardrailStop: one tripped.
    """
    guard = current_guard.get()
    if guard is None or guard.input_checked:
        return
    guard.input_checked = True
    if state.turn != 0 or not guard.of(GuardrailPoint.INPUT):
        return
    _, failed = await guard.apply(GuardrailPoint.INPUT, _input_text(state))
    if failed is not None:
        raise GuardrailStop(failed)


async def guard_output(state: Any, message: Any) -> None:
    """After a model turn, before its message is saved: an answer (no tool calls, some text)
    goes through the output guardrails. A trip keeps the answer out of the history (the model
    call is still recorded) and retracts its streamed text.

    Raises:
        GuardrailStop: one tripped.
    """
    guard = current_guard.get()
    if guard is None or message.tool_calls or not message.content.strip() or not guard.of(GuardrailPoint.OUTPUT):
        return
    _, failed = await guard.apply(GuardrailPoint.OUTPUT, message.content, retracted=True)
    if failed is not None:
        answer = state.record.take_answer()
        if answer is not None:
            await state.record(answer)
        raise GuardrailStop(failed)


async def guard_handoff_reply(reply: str) -> None:
    """Before a handoff's reply becomes this run's answer (``sessions.runner.turn.handed_off``):
    the calling agent's output guardrails, as on an answer of its own model. The agent handed
    to has checked the reply with its own in its sub-run; the caller's rules hold for what its
    run answers as well.

    Raises:
        GuardrailStop: one tripped (the chat is not handed over).
    """
    guard = current_guard.get()
    if guard is None or not reply.strip() or not guard.of(GuardrailPoint.OUTPUT):
        return
    _, failed = await guard.apply(GuardrailPoint.OUTPUT, reply)
    if failed is not None:
        raise GuardrailStop(failed)


def guard_tripped(state: Any) -> None:
    """After a turn's tool calls: end the run if a guardrail stopped one of them.

    Raises:
        GuardrailStop: one did.
    """
    guard = current_guard.get()
    if guard is not None and guard.tripped is not None:
        raise GuardrailStop(guard.tripped)


async def _masked_arguments(guardrail: GuardrailSpec, value: Any) -> tuple[Any, int, Verdict | None]:
    """``value`` (the arguments, or a part) with each string masked by ``guardrail``: ``(value,
    masks, None)``, or ``(value, 0, verdict)`` when the guardrail could not run and fails closed."""
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            out[key], masks, stop = await _masked_arguments(guardrail, item)
            if stop is not None:
                return value, 0, stop
            total += masks
        return out, total, None
    if isinstance(value, list):
        items, total = [], 0
        for item in value:
            masked, masks, stop = await _masked_arguments(guardrail, item)
            if stop is not None:
                return value, 0, stop
            items.append(masked)
            total += masks
        return items, total, None
    if isinstance(value, str):
        verdict = await check(guardrail, value, ask=None)
        if verdict.tripped:
            return value, 0, verdict
        return (verdict.masked, verdict.masks, None) if verdict.masked is not None else (value, 0, None)
    return value, 0, None


async def _guard_arguments(guard: RunGuard, call: ToolInvocation) -> ToolOutcome | None:
    """The tool-call guardrails on ``call``'s arguments, in order: a ``block`` one checks them as
    JSON text (a JSON Schema guardrail validates the arguments object), a ``mask`` one rewrites
    each string argument. A failed outcome when one tripped, else None (``call.arguments`` masked)."""
    arguments: Any = call.arguments if call.arguments is not None else {}
    tool_call_id = call.context.tool_call_id
    for guardrail in guard.of(GuardrailPoint.TOOL_CALL):
        if guardrail.action == GuardrailAction.MASK:
            arguments, masks, verdict = await _masked_arguments(guardrail, arguments)
            if masks:
                guard.masked.append({"guardrail": guardrail.name, "point": guardrail.point, "masks": masks,
                                     "tool_call_id": tool_call_id})
        else:
            verdict = await check(guardrail, json.dumps(arguments, ensure_ascii=False), ask=_ask_for(guard.spec))
            if verdict.error and not verdict.tripped:
                logger.warning("run %s: guardrail %r could not run and fails open: %s", guard.spec.run_id,
                               guardrail.name, verdict.error)
        if verdict is not None and verdict.tripped:
            error = await guard.trip(guardrail, verdict, retracted=False, tool_call_id=tool_call_id)
            return ToolOutcome.failure(error, code=TRIPPED_CODE)
    if call.arguments is not None:
        call.arguments = arguments
    return None


class GuardrailCallToolset(WrapperToolset):
    """The tool-call guardrails (after the approval policy, before the call is recorded as
    started): a tripped one fails the call with its message (the tool never runs, and the run
    ends after the turn's calls: :func:`guard_tripped`); ``mask`` rewrites the arguments."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        guard = current_guard.get()
        if guard is not None and guard.of(GuardrailPoint.TOOL_CALL) and call.arguments_error is None:
            blocked = await _guard_arguments(guard, call)
            if blocked is not None:
                return blocked
        return await self.wrapped.call_tool(call)


class GuardrailResultToolset(WrapperToolset):
    """The tool-result guardrails (inside the output wrapper: what it stores and frames is
    already checked): a tripped one fails the call with its message (the model never reads the
    result); ``mask`` replaces the matches in the result (not a trip)."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        outcome = await self.wrapped.call_tool(call)
        guard = current_guard.get()
        if guard is None or outcome.status != SUCCEEDED or not guard.of(GuardrailPoint.TOOL_RESULT):
            return outcome
        text, failed = await guard.apply(GuardrailPoint.TOOL_RESULT, outcome.content,
                                         tool_call_id=call.context.tool_call_id)
        if failed is not None:
            return ToolOutcome.failure(failed, code=TRIPPED_CODE)
        if text != outcome.content:
            outcome.content, outcome.data = text, None  # the structured data would hold the unmasked values
        return outcome
