"""The rows a run writes besides its own status: its messages, each model turn (the
assistant message, its tool calls, the LLM call, the usage), each tool call's start and
outcome, compactions and approval requests.

The per-turn writes (``async def``) are one plain-SQL statement each on the run's event loop
(:mod:`sessions.runner.pg`); the rest are ORM transactions, called from a thread
(:func:`sessions.runner.threads.db`). Every function expects the caller's tenant scope and
filters by it.

A write that clients see publishes its own event through the run's ``publish`` (the
runner's publisher; a sub-run's adds its parent's ids), once the write has committed: the
plain-SQL ones after their statement returns (autocommit: it has committed by then), the
ORM ones after their transaction on the database thread. A write that records nothing (a
tool call's result recorded before) publishes nothing:

========================  ========================================================
function                  event (after the commit)
========================  ========================================================
``tool_call_start``       ``tool_call_started {tool_call_id, name, arguments}``
``tool_call_finish``      ``tool_call_succeeded`` / ``tool_call_failed`` (only if recorded now)
``compaction_begin``      ``compaction_running {attempt, tokens_before, messages}`` (no row yet)
``compaction_save``       ``compaction_completed`` (``ok`` or not, with the row's id)
``approval_request``      none: the run's pause announces its approvals
                          (``run_awaiting_approval``, :func:`sessions.runs.run_pause`)
``message_insert``,       none: a message's text reached clients as it streamed
``assistant_message_save``, (``content_token``), its tool calls as they start
``llm_call_record``
========================  ========================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from llm.metering import LLMCallPurpose
from llm.records import AttemptRecord
from llm.sanitize import clean_json, clean_json_text, clean_text
from llm.types import ChatMessage
from sessions.llm_bodies import body_columns
from sessions.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    ChatSession,
    Compaction,
    MessageRole,
    ToolCall,
    ToolCallStatus,
)
from sessions.runner.pg import pg_connection
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db
from sessions.runs import statements as sql
from sessions.selectors import approvers_resolve
from tenants.scoping import require_tenant_id

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""The run's publisher: ``await publish(event_type, data)`` (:data:`sessions.runs.Publish`)."""


RunEventObserver = Callable[[int, int, str, dict[str, Any]], None]
"""Told of a run's committed end or pause: ``(tenant_id, run_id, event type, event data)``, the
event the run's transition publishes: ``run_completed``, ``run_failed``, ``run_cancelled``
(:func:`sessions.runs.ending.end_event`), ``run_awaiting_approval {approvals}``
(:func:`sessions.runs.transitions.run_pause`) or ``approval_resolved {approval_id, tool_call_id,
status, sub_run_id, kind, tool_name, decided_by, reason, on_timeout}`` (an approval decided by a
person or by its timeout, :mod:`sessions.runs.approvals`)."""

run_event_observers: list[RunEventObserver] = []
"""The port through which apps above sessions learn that runs ended or wait for approvals
(filled by their ``AppConfig.ready()``: automations' outbound webhooks), so sessions imports
none of them. Called on a database thread or on the commit, in no particular tenant scope; an
observer must be quick (write a row, queue a task) and its error is logged, never raised."""


RunEventWants = Callable[[int, str, bool], bool]
"""An observer's optional quick check, its ``wants`` attribute: ``(tenant_id, event type,
push_configured) -> bool``, False only when it surely does nothing with the event; no I/O, any
thread (:func:`run_event_wanted`)."""


def run_event_wanted(tenant_id: int, event_type: str, *, push_configured: bool = True) -> bool:
    """Whether any of :data:`run_event_observers` may act on the event: one without a ``wants``
    check, or whose check says so. ``push_configured``: the run has an A2A push-notification
    config (its end's statement tells; True when unknown). A run's end skips the thread hop of
    :func:`run_event_observe` when none may (issue 39's guard: a run of a tenant with no
    subscription and no push config pays nothing for them; bench/README.md)."""
    for observer in run_event_observers:
        wants: RunEventWants | None = getattr(observer, "wants", None)
        if wants is None or wants(tenant_id, event_type, push_configured):
            return True
    return False


def run_event_observe(tenant_id: int, run_id: int, event_type: str, data: dict[str, Any]) -> None:
    """Call every :data:`run_event_observers` entry; an error is logged and the next is called."""
    for observer in run_event_observers:
        try:
            observer(tenant_id, run_id, event_type, data)
        except Exception:
            logging.getLogger(__name__).exception("a run-event observer failed for run %s", run_id)


def message_insert(**fields: Any) -> int:
    """Insert one message of run ``run_id`` at the session's next position (row-locked until
    the transaction ends); returns its id. Keyword arguments: ``session_id``, ``run_id``,
    ``role``, ``content``, and optionally ``reasoning``, ``tool_calls`` (``[{id, name,
    arguments}]``), ``tool_call_id``, ``name``.

    One statement: the position's ``UPDATE … RETURNING`` and the ``INSERT`` in one CTE (the
    runner writes a message at every turn and every tool result; the ORM's model
    construction, query compilation and a second round trip were most of that write's CPU).
    The runner's own messages are written by :data:`sql.TURN_SAVE_SQL` and
    :data:`sql.TOOL_CALL_FINISH_SQL`, which take the position the same way.

    Raises:
        ChatSession.DoesNotExist: no such session in the current tenant.
    """
    params = sql.message_params(**fields)
    with connection.cursor() as cursor:
        cursor.execute(sql.MESSAGE_INSERT_SQL, params)
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"session {params['session_id']} not found")
    return row[0]



def _parsed_arguments(call: Any) -> str:
    """A tool call's arguments as JSON text of an object (``{}`` when they are not valid JSON)."""
    try:
        arguments: Any = call.parsed_arguments()
    except ValueError:
        arguments = {}
    return json.dumps(clean_json(arguments))


def _turn_params(
    *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str, llm_call: AttemptRecord | None,
) -> dict[str, Any]:
    """The parameters of :data:`sql.TURN_SAVE_SQL` (and of its LLM call, when given)."""
    calls = message.tool_calls
    params = sql.message_params(
        session_id=spec.session_id, run_id=spec.run_id, role=MessageRole.ASSISTANT, content=message.content,
        reasoning=reasoning,
        tool_calls=[{"id": c.id, "name": c.name, "arguments": clean_json_text(c.arguments)} for c in calls],
    )
    params.update(
        turn=turn, loop_count=turn + 1, pending=ToolCallStatus.PENDING.value,
        prompt_tokens=0, completion_tokens=0, cost_usd_micros=0,
        call_ids=[clean_text(c.id) for c in calls], names=[clean_text(c.name) for c in calls],
        arguments=[_parsed_arguments(c) for c in calls], arguments_raw=[clean_json_text(c.arguments) for c in calls],
    )
    if llm_call is not None:
        params.update(prompt_tokens=llm_call.prompt_tokens, completion_tokens=llm_call.completion_tokens,
                      cost_usd_micros=llm_call.cost_usd_micros)
        params.update(_llm_call_params(spec=spec, turn=turn, record=llm_call))
    return params


async def assistant_message_save(
    *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str = "", llm_call: AttemptRecord | None = None,
) -> list[dict[str, Any]]:
    """Persist an assistant message and its tool calls (``pending``; arguments that are not
    a JSON object are stored as ``{}`` beside the raw text); counts the turn. With
    ``llm_call`` (the attempt that produced the message), also its LLMCall row and usage, and
    its model call record when it carries bodies (:mod:`sessions.llm_bodies`).
    One statement (:data:`sql.TURN_SAVE_SQL`).

    Returns:
        ``[{pk, call_id, name, arguments_raw}]`` for the tool calls, in the model's order.

    Raises:
        ChatSession.DoesNotExist: no such session in the current tenant (nothing written).
    """
    params = _turn_params(spec=spec, turn=turn, message=message, reasoning=reasoning, llm_call=llm_call)
    statement = sql.TURN_SAVE_WITH_LLM_CALL_SQL if llm_call is not None else sql.TURN_SAVE_ONLY_SQL
    if llm_call is not None and llm_call.bodies is not None:  # the tenant records bodies
        body = _body_params(llm_call)
        if body is not None:
            params.update(body)
            statement = sql.TURN_SAVE_WITH_LLM_CALL_BODY_SQL
    async with pg_connection() as conn:
        cursor = await conn.execute(statement, params)
        rows = await cursor.fetchall()
    if not rows:
        raise ChatSession.DoesNotExist(f"session {spec.session_id} not found")
    pks = {call_id: pk for _, pk, call_id in rows if pk is not None}  # call ids are unique per run
    return [{"pk": pks[clean_text(c.id)], "call_id": clean_text(c.id), "name": clean_text(c.name),
             "arguments_raw": clean_json_text(c.arguments)} for c in message.tool_calls]



async def tool_call_start(*, pk: int, name: str, arguments: Any, publish: Publish) -> None:
    """Mark tool call ``pk`` ``running`` (started now), then publish ``tool_call_started
    {tool_call_id: pk, name, arguments}`` (``arguments``: the call's arguments as shown to
    clients, an object, or the model's raw text when it is not JSON). One statement
    (:data:`sql.TOOL_CALL_START_SQL`), committed before the event; the runner calls this
    before the tool runs, so clients see the call start first.
    """
    async with pg_connection() as conn:
        await conn.execute(sql.TOOL_CALL_START_SQL, {
            "status": ToolCallStatus.RUNNING.value, "now": timezone.now(), "pk": pk, "tenant_id": require_tenant_id(),
        })
    await publish("tool_call_started", {"tool_call_id": pk, "name": name, "arguments": arguments})



async def tool_call_finish(
    *, spec: RunSpec, pk: int, name: str, status: str, content: str, data: Any, error: str, duration_ms: int,
    publish: Publish, model_content: str | None = None,
) -> bool:
    """Record a tool call's outcome and its tool message (one statement,
    :data:`sql.TOOL_CALL_FINISH_SQL`), then publish it. Idempotent: False if already recorded
    (nothing written, nothing published).

    ``content`` is the result as the tool returned it (ToolCall.result, shown in the UI);
    ``model_content``, when given, is what the model reads instead (the tool message), e.g.
    the result (or an outside tool's error) framed as untrusted data. Else a failed call's
    message is ``Error: <error>``. ``name``: the tool's exposed name (for the event);
    ``duration_ms``: how long it ran, in milliseconds.

    Emits after the commit, when recorded now: ``tool_call_succeeded {tool_call_id, name,
    result, duration_ms}`` (with ``data`` when the tool returned structured data), or
    ``tool_call_failed {tool_call_id, name, error, status, duration_ms}`` for any other
    ``status`` (failed, timed_out, cancelled).
    """
    result_data = clean_json(_jsonable(data))
    content, error = clean_text(content), clean_text(error)
    model_content = clean_text(model_content) if model_content is not None else None
    succeeded = status == ToolCallStatus.SUCCEEDED
    params = {
        "status": status, "result": content if succeeded else "",
        "result_data": None if result_data is None else json.dumps(result_data), "error": error,
        "now": timezone.now(), "duration_ms": duration_ms, "pk": pk, "tenant_id": require_tenant_id(),
        "session_id": spec.session_id, "run_id": spec.run_id, "role": MessageRole.TOOL.value,
        "content": model_content if model_content is not None else (content if succeeded else f"Error: {error}"),
    }
    async with pg_connection() as conn:
        cursor = await conn.execute(sql.TOOL_CALL_FINISH_SQL, params)
        recorded = await cursor.fetchone() is not None
    if recorded:
        await publish(*tool_call_finished_event(pk=pk, name=name, status=status, content=content, data=result_data,
                                                error=error, duration_ms=duration_ms))
    return recorded


def tool_call_finished_event(
    *, pk: int, name: str, status: str, content: str, data: Any, error: str, duration_ms: int,
) -> tuple[str, dict[str, Any]]:
    """The event announcing a recorded tool call outcome: ``("tool_call_succeeded", {…})`` or
    ``("tool_call_failed", {…})`` (see :func:`tool_call_finish`; in-memory stores use it too)."""
    if status == ToolCallStatus.SUCCEEDED:
        succeeded: dict[str, Any] = {"tool_call_id": pk, "name": name, "result": content, "duration_ms": duration_ms}
        if data is not None:
            succeeded["data"] = data
        return "tool_call_succeeded", succeeded
    return "tool_call_failed", {"tool_call_id": pk, "name": name, "error": error, "status": status,
                                "duration_ms": duration_ms}


def _jsonable(data: Any) -> Any:
    if data is None:
        return None
    try:
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return {"repr": repr(data)[:10_000]}


async def llm_call_record(
    *, spec: RunSpec, turn: int, record: AttemptRecord, purpose: str = LLMCallPurpose.TURN.value,
) -> None:
    """Write the LLMCall row and add its tokens and cost to the run's totals (one transaction).

    ``purpose``: an :class:`~llm.metering.LLMCallPurpose` value: ``turn`` for the run's model
    turns, ``compaction`` for its context compaction's summary (the row keeps its run and
    turn either way, so the run's totals and budgets count it).

    Raises:
        ValueError: ``purpose`` is not an ``LLMCallPurpose`` value (nothing written).
    """
    if purpose not in LLMCallPurpose.values:
        raise ValueError(f"unknown LLM call purpose {purpose!r}")
    async with pg_connection() as conn, conn.transaction():
        await _run_add_usage(conn, spec=spec, record=record)
        await _llm_call_insert(conn, spec=spec, turn=turn, record=record, purpose=purpose)


def _llm_call_params(
    *, spec: RunSpec, turn: int, record: AttemptRecord, purpose: str = LLMCallPurpose.TURN.value,
) -> dict[str, Any]:
    """The LLMCall row of ``record``, by column (:data:`sql.LLM_CALL_COLUMNS`); ``rolled_up``
    false: the rollup's trigger counts the row, unless :data:`sql.TURN_LLM_CALL_CTE` writes it
    (which writes the column ``TRUE`` and counts the row itself)."""
    entry_id = spec.entry_ids[record.entry_index] if record.entry_index < len(spec.entry_ids) else None
    return {
        "tenant_id": require_tenant_id(), "run_id": spec.run_id, "turn": turn, "purpose": str(purpose),
        "agent_id": spec.agent_id, "user_id": spec.user_id, "attempt": record.attempt,
        "route_entry_id": entry_id, "entry_index": record.entry_index, "provider_name": record.provider_name,
        "model": record.model, "status": record.status, "error_class": record.error_class or "",
        "error": clean_text(record.error[:5000]), "latency_ms": max(0, record.latency_ms),
        "first_token_ms": record.first_token_ms, "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens, "usage_estimated": record.usage_estimated,
        "cost_usd_micros": record.cost_usd_micros, "retry_wait_ms": record.retry_wait_ms,
        "rolled_up": False, "created_at": timezone.now(),
    }


async def _llm_call_insert(conn: Any, *, spec: RunSpec, turn: int, record: AttemptRecord, purpose: str) -> None:
    """One LLMCall row for ``record`` (a plain INSERT), with its model call record in the same
    statement when it carries bodies."""
    params = _llm_call_params(spec=spec, turn=turn, record=record, purpose=purpose)
    body = None if record.bodies is None else _body_params(record)
    if body is None:
        await conn.execute(sql.LLM_CALL_INSERT_SQL, params)
        return
    params.update(body)
    await conn.execute(sql.LLM_CALL_WITH_BODY_INSERT_SQL, params)


def _body_params(record: AttemptRecord) -> dict[str, Any] | None:
    """The ``body_<column>`` parameters of :func:`sql.llm_call_body_cte` for ``record``'s
    model call record, or None when it has no request body to keep."""
    columns = body_columns(record)
    return None if columns is None else {f"body_{name}": value for name, value in columns.items()}


async def _run_add_usage(
    conn: Any, *, spec: RunSpec, record: AttemptRecord | None, loop_count: int | None = None,
) -> None:
    """Add ``record``'s tokens and cost to the run's totals; with ``loop_count``, also set it
    (the turn is counted)."""
    await conn.execute(sql.RUN_ADD_USAGE_SQL, {
        "loop_count": loop_count, "run_id": spec.run_id, "tenant_id": require_tenant_id(),
        "prompt_tokens": record.prompt_tokens if record else 0,
        "completion_tokens": record.completion_tokens if record else 0,
        "cost_usd_micros": record.cost_usd_micros if record else 0,
    })


async def compaction_begin(*, attempt: int, tokens_before: int, messages: int, publish: Publish) -> None:
    """Announce compaction attempt ``attempt`` of the current model turn: ``compaction_running
    {attempt, tokens_before, messages}`` (``tokens_before``: the prompt's estimated tokens;
    ``messages``: how many are being summarized). Writes nothing: the attempt's row is written
    when it ends (:func:`compaction_save`)."""
    await publish("compaction_running", {"attempt": attempt, "tokens_before": tokens_before, "messages": messages})


async def compaction_save(
    *, spec: RunSpec, attempt: int, status: str, publish: Publish, summary: str = "",
    cursor_message_id: int | None = None, messages_summarized: int = 0, tokens_before: int = 0,
    tokens_after: int = 0, error: str = "",
) -> int:
    """Record a compaction attempt (``status``: ``succeeded`` or ``failed``); a succeeded one
    moves the session's cursor to ``cursor_message_id``. One ORM transaction on a database
    thread.

    Emits after its commit: ``compaction_completed {ok: true, compaction_id, attempt,
    tokens_before, tokens_after, messages}`` (``messages``: ``messages_summarized``), or
    ``{ok: false, compaction_id, attempt, error}`` for a failed attempt.

    Returns:
        The Compaction row's id.
    """
    compaction_id = await db(_compaction_insert)(
        spec=spec, attempt=attempt, status=status, summary=summary, cursor_message_id=cursor_message_id,
        messages_summarized=messages_summarized, tokens_before=tokens_before, tokens_after=tokens_after, error=error,
    )
    await publish("compaction_completed", compaction_completed_event(
        compaction_id=compaction_id, attempt=attempt, status=status, tokens_before=tokens_before,
        tokens_after=tokens_after, messages_summarized=messages_summarized, error=error,
    ))
    return compaction_id


def compaction_completed_event(
    *, compaction_id: int, attempt: int, status: str, tokens_before: int, tokens_after: int,
    messages_summarized: int, error: str,
) -> dict[str, Any]:
    """The ``compaction_completed`` payload of a recorded attempt (see :func:`compaction_save`;
    in-memory stores use it too)."""
    if status == "succeeded":
        return {"ok": True, "compaction_id": compaction_id, "attempt": attempt, "tokens_before": tokens_before,
                "tokens_after": tokens_after, "messages": messages_summarized}
    return {"ok": False, "compaction_id": compaction_id, "attempt": attempt, "error": error}


@transaction.atomic
def _compaction_insert(
    *, spec: RunSpec, attempt: int, status: str, summary: str, cursor_message_id: int | None,
    messages_summarized: int, tokens_before: int, tokens_after: int, error: str,
) -> int:
    """:func:`compaction_save`'s transaction: the Compaction row; its id."""
    row = Compaction.objects.create(
        tenant_id=spec.tenant_id, session_id=spec.session_id, run_id=spec.run_id, attempt=attempt, status=status,
        summary=clean_text(summary), cursor_message_id=cursor_message_id, messages_summarized=messages_summarized,
        tokens_before=tokens_before, tokens_after=tokens_after, error=clean_text(error[:5000]),
    )
    return row.pk



@transaction.atomic
def approval_request(
    *, spec: RunSpec, call_pk: int, kind: str, tool_name: str, arguments: Any, reason: str = "", question: str = "",
    elicitation: Any = None, rule: Mapping[str, Any] | None = None,
) -> int:
    """Record that tool call ``call_pk`` of run ``spec`` waits for a human (approval or
    answer). Idempotent.

    ``elicitation`` (kinds ``elicitation`` and ``sampling``): ``{"request": ...}``, the MCP
    server's request for input, or for the agent's model (:func:`capabilities.mcp.sampling.sampling_question`).
    A call whose server asks again after an answer (the next question of a multi-round-trip
    call, or a question after the call's own approval) gets its Approval back, pending, with
    the new request, kind and terms (``rule``'s: the approvers and expiry action of an
    approval rule that decided the call before do not carry over).

    ``rule``: the approval rule that asked (kind ``tool_call`` from the binding's policy,
    :class:`capabilities.tools.ApprovalRequired`), whose terms the Approval keeps
    (:func:`approval_terms`): its approvers resolved now, its expiry and what the expiry does.
    Its ``message`` is the ``reason`` given. Without a rule the run's user decides within
    ``APPROVAL_TTL_SECONDS`` and the expiry fails the run. Kind ``elicitation``: ``{"timeout_seconds"}``
    only, the binding's ``elicitation_timeout_seconds`` (each question asked again gets it anew);
    its expiry is a decline (:func:`sessions.runs.approvals.approvals_expire`).

    The Approval belongs to the user's run (``spec.waiting_run_id``: the run itself, or the
    top of a sub-run's tree), with ``sub_run`` set when the call is a sub-run's.

    Returns the Approval id. The call is marked ``awaiting_approval``.

    Publishes nothing: the approval is announced with the run's pause (``run_awaiting_approval
    {approvals}``, :func:`sessions.runs.run_pause` / :func:`sessions.runs.subrun_pause`), once
    the turn's other calls are done and a human can decide it.
    """
    approval, _ = Approval.objects.get_or_create(
        tool_call_id=call_pk,
        defaults={
            "tenant_id": spec.tenant_id, "run_id": spec.waiting_run_id,
            "sub_run_id": spec.run_id if spec.depth > 0 else None, "kind": kind, "tool_name": tool_name,
            "arguments": clean_json(_jsonable(arguments)) or {}, "reason": clean_text(reason[:5000]),
            "question": clean_text(question), "elicitation": clean_json(elicitation),
            **approval_terms(rule, now=timezone.now()),
        },
    )
    if kind in (ApprovalKind.ELICITATION, ApprovalKind.SAMPLING) and approval.status != ApprovalStatus.PENDING:
        approval.status, approval.elicitation, approval.question = ApprovalStatus.PENDING, clean_json(elicitation), \
            clean_text(question)
        approval.kind = kind  # a server may ask for input, then for the model, in one call
        approval.decided_by, approval.decided_at, approval.answer = None, None, ""
        # The question's own terms, not those of the rule that approved the call before it (its
        # approvers and expiry action): the run's user answers, and its expiry declines.
        terms = approval_terms(rule, now=timezone.now())
        approval.approvers, approval.expires_at, approval.on_timeout = \
            terms["approvers"], terms["expires_at"], terms["on_timeout"]
        approval.save(update_fields=["status", "kind", "elicitation", "question", "decided_by", "decided_at",
                                     "answer", "expires_at", "approvers", "on_timeout"])
    ToolCall.objects.filter(pk=call_pk).update(status=ToolCallStatus.AWAITING_APPROVAL)
    return approval.pk


def approval_terms(rule: Mapping[str, Any] | None, *, now: datetime) -> dict[str, Any]:
    """An approval's terms from the rule that asked (None: the defaults), as Approval fields:
    ``approvers`` (:func:`sessions.selectors.approvers_resolve`, in the current tenant),
    ``expires_at`` (``now`` plus the rule's ``timeout_seconds``, else the
    ``APPROVAL_TTL_SECONDS`` setting) and ``on_timeout`` (``deny``, ``approve``, or ``""``:
    the run fails)."""
    from datetime import timedelta

    from django.conf import settings

    rule = rule or {}
    timeout = rule.get("timeout_seconds") or settings.APPROVAL_TTL_SECONDS
    return {"approvers": approvers_resolve(rule.get("approvers")), "expires_at": now + timedelta(seconds=timeout),
            "on_timeout": str(rule.get("on_timeout") or "")}


def elicitation_public(elicitation: Any) -> dict[str, Any] | None:
    """What a person (the chat app, the approvals API) sees of an elicitation's request:
    ``{mode, message, schema, url, server, tool}`` (not the server's opaque state); None for
    other kinds."""
    request = (elicitation or {}).get("request") if isinstance(elicitation, dict) else None
    if not isinstance(request, dict) or request.get("type") in ("sampling", "connection"):
        return None
    return {k: request.get(k) for k in ("mode", "message", "schema", "url", "server", "tool")}


def connection_public(elicitation: Any) -> dict[str, Any] | None:
    """What a person sees of an account a run waits for (kind ``connection``): ``{server
    (alias), server_id, server_name, auth_mode ("oauth_user" | "oauth_tenant"), tool, retry
    (a refused call made again once connected), message (why)}``; None for other kinds."""
    request = (elicitation or {}).get("request") if isinstance(elicitation, dict) else None
    if not isinstance(request, dict) or request.get("type") != "connection":
        return None
    return {k: request.get(k) for k in ("server", "server_id", "server_name", "auth_mode", "tool", "retry", "message")}


def sampling_public(elicitation: Any) -> dict[str, Any] | None:
    """What a person sees of an MCP server's request for the agent's model (kind
    ``sampling``): ``{server, tool, message, requests: [{messages: [{role, text}],
    system_prompt, max_tokens, offers_tools, tools: [name]}]}`` (texts cut, not the server's
    state nor the raw request); None for other kinds."""
    request = (elicitation or {}).get("request") if isinstance(elicitation, dict) else None
    if not isinstance(request, dict) or request.get("type") != "sampling":
        return None
    return {"server": request.get("server"), "tool": request.get("tool"), "message": request.get("message"),
            "requests": [item.get("shown") or {} for item in request.get("requests") or () if isinstance(item, dict)]}


def approval_payload(a: Approval) -> dict[str, Any]:
    """An approval as it appears in events: ``sub_run_id`` and ``skill`` (the skill's name) are
    set when the call is a skill's sub-run's, else None. Load with ``select_related("sub_run__skill")``."""
    return {
        "approval_id": a.pk, "tool_call_id": a.tool_call_id, "kind": a.kind, "status": a.status,
        "tool_name": a.tool_name, "arguments": a.arguments, "reason": a.reason, "question": a.question,
        "elicitation": elicitation_public(a.elicitation), "sampling": sampling_public(a.elicitation),
        "connection": connection_public(a.elicitation), "expires_at": a.expires_at.isoformat(), "sub_run_id": a.sub_run_id,
        "skill": a.skill_name, "approvers": a.approvers or {}, "on_timeout": a.on_timeout,
    }
