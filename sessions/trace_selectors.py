"""The run trace: everything one run did, turn by turn (a selector: reads only).

Served to the run's own user by ``GET /api/v1/runs/<id>/trace/`` (``admin=False``: the
fields a member may see) and to tenant admins by the console's trace page (``admin=True``:
every field). The caller has already decided that the requester may see ``run``; every
query here is held to ``run.tenant_id`` as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agents.models import AgentVersion
from llm.errors import public_error_message
from llm.metering import LLMCallPurpose
from sessions.models import (
    Approval,
    Compaction,
    LLMCall,
    LLMCallBody,
    Message,
    MessageRole,
    Run,
    RunFailureReason,
    ToolCall,
)

# Fields only tenant admins see (the console, or an admin's API call with ?admin=1 is NOT
# offered: admins use the console). Members never get these keys at all.
ADMIN_ONLY_FIELDS = frozenset({
    "prompt", "system_prompt", "reasoning", "provider_name", "raw_error", "user", "worker_attempts",
    "decided_by", "context_messages_before", "routing", "route", "bodies",
})


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _ms_between(start: datetime | None, end: datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return max(0, int((end - start).total_seconds() * 1000))


def usd(micros: int | None) -> str:
    """Micro-USD as a decimal string of dollars (``1234567`` → ``"1.234567"``)."""
    return f"{(micros or 0) / 1_000_000:.6f}"


@dataclass(frozen=True, slots=True)
class _RunRows:
    """The rows of one run that its trace is made of (six queries)."""

    calls: list[LLMCall]
    """Its model calls, by turn then creation."""
    tools: list[ToolCall]
    """Its tool calls, by turn then id."""
    approvals: dict[int, Approval]
    """Tool call id → the approval asked for it."""
    sub_runs: dict[int, Run]
    """Tool call id → the sub-run (skill) it started."""
    compactions: list[Compaction]
    """Its compactions, in order."""
    messages: list[Message]
    """Its messages, by position."""
    bodies: dict[int, LLMCallBody]
    """LLM call id → its model call record (request and response bodies); read for admins only."""

    @property
    def compaction_calls(self) -> list[LLMCall]:
        """The summary requests of its compactions (purpose ``compaction``), in order."""
        return [c for c in self.calls if c.purpose == LLMCallPurpose.COMPACTION]


def _run_rows(run: Run, *, admin: bool = False) -> _RunRows:
    tenant_id = run.tenant_id
    # tenant-bypass: every query below names the run (already authorised) and its tenant.
    return _RunRows(
        calls=list(LLMCall.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("turn", "created_at", "id")),
        tools=list(ToolCall.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("turn", "id")),
        approvals={
            a.tool_call_id: a for a in Approval.all_tenants.filter(
                tenant_id=tenant_id, tool_call__run_id=run.pk,
            ).select_related("decided_by")
        },
        sub_runs={
            r.parent_tool_call_id: r for r in Run.all_tenants.filter(
                tenant_id=tenant_id, parent_tool_call__run_id=run.pk,
            ).select_related("skill", "agent_version__agent")
        },
        compactions=list(Compaction.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("id")),
        messages=list(Message.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("position")),
        bodies={
            b.llm_call_id: b for b in LLMCallBody.all_tenants.filter(tenant_id=tenant_id, llm_call__run_id=run.pk)
        } if admin else {},
    )


_NOT_THE_ANSWER = (LLMCallPurpose.COMPACTION, LLMCallPurpose.SAMPLING)
"""Purposes of a turn's LLM calls that are not its answer's attempts (listed apart)."""


def _sampling_calls(calls: list[LLMCall], turn: int, *, admin: bool,
                    bodies: dict[int, LLMCallBody] | None = None) -> list[dict[str, Any]]:
    """Turn ``turn``'s ``sampling``-purpose calls (MCP servers' requests during its tool calls),
    in order; like a compaction's, each request is new, retried or fallen back within itself."""
    return _compaction_calls([c for c in calls if c.turn == turn and c.purpose == LLMCallPurpose.SAMPLING],
                             admin=admin, bodies=bodies)


def _message(m: Message, *, admin: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": m.pk, "position": m.position, "role": m.role, "content": m.content, "name": m.name,
        "tool_call_id": m.tool_call_id,
        "tool_calls": [{"name": c.get("name", ""), "arguments": c.get("arguments", "")} for c in (m.tool_calls or [])],
    }
    if admin:
        out["reasoning"] = m.reasoning
    return out


def _attempt(call: LLMCall, previous: LLMCall | None, *, admin: bool,
             bodies: dict[int, LLMCallBody] | None = None) -> dict[str, Any]:
    """One LLM call of the run as a trace row; ``previous``: the call before it that it may
    repeat (None: a first try), so the row is a retry on the same route entry or a fallback
    to another one. ``bodies``: the run's model call records by call id (admins only)."""
    fallback = previous is not None and previous.entry_index != call.entry_index
    retry = previous is not None and previous.entry_index == call.entry_index
    out: dict[str, Any] = {
        "id": call.pk, "purpose": call.purpose, "attempt": call.attempt, "entry_index": call.entry_index,
        "model": call.model,
        "status": call.status, "error_class": call.error_class,
        "error": public_error_message(call.error_class) if call.error_class else "",
        "latency_ms": call.latency_ms, "first_token_ms": call.first_token_ms, "retry_wait_ms": call.retry_wait_ms,
        "prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
        "usage_estimated": call.usage_estimated, "cost_usd": usd(call.cost_usd_micros),
        "is_retry": retry, "is_fallback": fallback, "at": _iso(call.created_at),
    }
    if admin:
        out["provider_name"] = call.provider_name
        out["raw_error"] = call.error
        out["bodies"] = _bodies((bodies or {}).get(call.pk))
    return out


def _bodies(body: LLMCallBody | None) -> dict[str, Any] | None:
    """A call's model call record for the trace: ``{request, request_bytes, request_truncated,
    response, response_bytes, response_truncated}`` (JSON text as stored: a cut body is no
    longer JSON), or None when none was kept."""
    if body is None:
        return None
    return {"request": body.request, "request_bytes": body.request_bytes, "request_truncated": body.request_truncated,
            "response": body.response, "response_bytes": body.response_bytes,
            "response_truncated": body.response_truncated}


def _approval(a: Approval | None, *, admin: bool, run_user_id: int) -> dict[str, Any] | None:
    if a is None:
        return None
    out: dict[str, Any] = {
        "id": a.pk, "kind": a.kind, "status": a.status, "reason": a.reason, "question": a.question,
        "answer": a.answer, "created_at": _iso(a.created_at), "decided_at": _iso(a.decided_at),
        "expires_at": _iso(a.expires_at),
        "decided_by_run_user": a.decided_by_id is not None and a.decided_by_id == run_user_id,
        "decided_on_timeout": a.decided_on_timeout, "on_timeout": a.on_timeout, "approvers": a.approvers or {},
        "wait_ms": _ms_between(a.created_at, a.decided_at),
    }
    if admin:
        out["decided_by"] = a.decided_by.get_username() if a.decided_by is not None else None
    return out


def _tool_call(call: ToolCall, *, admin: bool, run_user_id: int, approvals: dict[int, Approval],
               sub_runs: dict[int, Run]) -> dict[str, Any]:
    sub = sub_runs.get(call.pk)
    return {
        "id": call.pk, "call_id": call.call_id, "name": call.name, "arguments": call.arguments,
        "status": call.status, "result": call.result, "error": call.error, "duration_ms": call.duration_ms,
        "started_at": _iso(call.started_at), "finished_at": _iso(call.finished_at),
        "server_log": call.server_log or [],  # an MCP server's log messages: [{level, logger, data, at}]
        "approval": _approval(approvals.get(call.pk), admin=admin, run_user_id=run_user_id),
        "sub_run": None if sub is None else {
            "id": sub.pk, "status": sub.status, "skill": sub.skill.name if sub.skill is not None else call.name,
            "agent": _sub_agent_name(sub), "reply": sub.reply, "loop_count": sub.loop_count,
        },
    }


def _sub_agent_name(sub: Run) -> str | None:
    """A sub-agent's sub-run (capability kind ``agent``): the agent's name; None for a skill's."""
    if sub.skill_id is not None or sub.agent_version is None:
        return None
    return sub.agent_version.agent.name


def _turn_attempts(calls: list[LLMCall], *, admin: bool,
                   bodies: dict[int, LLMCallBody] | None = None) -> list[dict[str, Any]]:
    """A turn's ``turn``-purpose calls in order: every call after the first repeats the turn's
    request (a router retry or fallback, or the turn restarted after a broken stream or a
    compaction), so it is a retry or a fallback."""
    return [_attempt(c, calls[i - 1] if i else None, admin=admin, bodies=bodies) for i, c in enumerate(calls)]


def _compaction_calls(calls: list[LLMCall], *, admin: bool,
                      bodies: dict[int, LLMCallBody] | None = None) -> list[dict[str, Any]]:
    """A turn's ``compaction``-purpose calls in order. Each compaction attempt is a new summary
    request (its first call has ``attempt`` 1, the router's count within one request), not a
    retry of the one before: only the router's later attempts within a request are retries
    or fallbacks."""
    return [_attempt(c, calls[i - 1] if i and c.attempt > 1 else None, admin=admin, bodies=bodies)
            for i, c in enumerate(calls)]


def _compaction(c: Compaction) -> dict[str, Any]:
    return {
        "id": c.pk, "attempt": c.attempt, "status": c.status, "messages_summarized": c.messages_summarized,
        "tokens_before": c.tokens_before, "tokens_after": c.tokens_after, "summary": c.summary, "error": c.error,
        "at": _iso(c.created_at),
    }


def _completions_and_prompts(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """The k-th assistant message of the run is turn k's completion; the messages between the
    previous assistant message and it are what was newly sent to the model in turn k.

    Returns ``(completions, prompts)``: ``prompts`` has one list more than ``completions``
    (what was sent after the last answer)."""
    completions: list[Message] = []
    prompts: list[list[Message]] = [[]]
    for m in messages:
        if m.role == MessageRole.ASSISTANT:
            completions.append(m)
            prompts.append([])
        else:
            prompts[-1].append(m)
    return completions, prompts


def _turn(turn: int, rows: _RunRows, *, completions: list[Message], prompts: list[list[Message]], run: Run,
          admin: bool) -> tuple[dict[str, Any], datetime | None]:
    """Turn ``turn`` of the trace (compactions not placed yet) and when its first model call
    for the answer was made (None: no such call)."""
    attempts = [c for c in rows.calls if c.turn == turn and c.purpose not in _NOT_THE_ANSWER]
    entry: dict[str, Any] = {
        "turn": turn,
        "attempts": _turn_attempts(attempts, admin=admin, bodies=rows.bodies),
        "compaction_calls": _compaction_calls([c for c in rows.compaction_calls if c.turn == turn], admin=admin,
                                              bodies=rows.bodies),
        "completion": _message(completions[turn], admin=admin) if turn < len(completions) else None,
        "tool_calls": [
            _tool_call(t, admin=admin, run_user_id=run.user_id, approvals=rows.approvals, sub_runs=rows.sub_runs)
            for t in rows.tools if t.turn == turn
        ],
        "compactions": [],
        # MCP servers' sampling requests during the turn's tool calls (purpose sampling): each a
        # new request, retried or fallen back within itself like a compaction's.
        "sampling_calls": _sampling_calls(rows.calls, turn, admin=admin, bodies=rows.bodies),
    }
    if admin:
        entry["prompt"] = [_message(m, admin=True) for m in prompts[turn]] if turn < len(prompts) else []
        # Routing rules: the route chosen from this turn on, when it changed here (agents.routing).
        entry["route"] = _route_chosen_at(run, turn)
    return entry, attempts[0].created_at if attempts else None


def _route_chosen_at(run: Run, turn: int) -> dict[str, Any] | None:
    """``{turn, rule, route}``: the model route the routing rules chose from ``turn`` on, when
    the choice changed at that turn (``Run.routing``), else None."""
    return next((c for c in run.routing or () if isinstance(c, dict) and c.get("turn") == turn), None)


def _turns(rows: _RunRows, *, run: Run, admin: bool) -> tuple[list[dict[str, Any]], list[datetime | None]]:
    """The trace's turns in order (compactions not placed yet) and, for each, when its first
    model call for the answer was made (None: no such call)."""
    completions, prompts = _completions_and_prompts(rows.messages)
    numbers = sorted({c.turn for c in rows.calls} | {t.turn for t in rows.tools} | set(range(len(completions))))
    pairs = [_turn(turn, rows, completions=completions, prompts=prompts, run=run, admin=admin) for turn in numbers]
    return [entry for entry, _ in pairs], [first_at for _, first_at in pairs]


def _compaction_turn(compaction: Compaction, *, turns: list[dict[str, Any]], first_ats: list[datetime | None],
                     compaction_calls: list[LLMCall]) -> dict[str, Any] | None:
    """The turn a compaction belongs to. A compaction happens before the model call of the
    turn that needed it: the turn of the summary request saved just before it, else (no such
    call recorded) the first turn answered after it, else the last turn (None: no turn)."""
    made_by = max((k for k in compaction_calls if k.created_at <= compaction.created_at),
                  key=lambda k: (k.created_at, k.pk), default=None)
    if made_by is not None:
        target = next((t for t in turns if t["turn"] == made_by.turn), None)
        if target is not None:
            return target
    answered_after = (t for t, at in zip(turns, first_ats, strict=True) if at is not None and at >= compaction.created_at)
    return next(answered_after, turns[-1] if turns else None)


def _run_summary(run: Run, *, messages: list[Message], admin: bool) -> dict[str, Any]:
    """The trace's ``run`` object (the admin-only keys when ``admin``)."""
    agent = run.session.agent
    out: dict[str, Any] = {
        "id": run.pk, "session_id": run.session_id, "status": run.status, "reason": run.reason,
        "reason_label": RunFailureReason(run.reason).label if run.reason in RunFailureReason.values else "",
        "purpose": run.purpose,
        "error": run.error, "input": run.input, "reply": run.reply, "loop_count": run.loop_count,
        "agent": {"id": agent.pk, "name": agent.name},
        "agent_version": None,  # the number of the agent's version the run ran (None: a run from before versions)
        "parent_run_id": None, "depth": run.depth,
        "created_at": _iso(run.created_at), "started_at": _iso(run.started_at), "finished_at": _iso(run.finished_at),
        "duration_ms": _ms_between(run.started_at, run.finished_at),
        "paused_seconds": run.paused_seconds,
        # What bound capabilities added to the model input at the run's start (knowledge passages, memories).
        "context": [{"source": b.get("source", ""), "title": b.get("title", ""), "text": b.get("text", ""),
                     "data": b.get("data")} for b in (run.context or []) if isinstance(b, dict)],
    }
    version = None
    if run.agent_version_id:
        # tenant-bypass: the run's own agent version, in the same tenant.
        version = AgentVersion.all_tenants.filter(tenant_id=run.tenant_id, pk=run.agent_version_id).first()
        out["agent_version"] = version.number if version else None
    if run.parent_tool_call_id:
        # tenant-bypass: the parent's tool call, in the same tenant.
        out["parent_run_id"] = ToolCall.all_tenants.filter(
            tenant_id=run.tenant_id, pk=run.parent_tool_call_id).values_list("run_id", flat=True).first()
    if admin:
        out["user"] = run.user.get_username()
        out["worker_attempts"] = run.attempt
        out["routing"] = run.routing or []  # [{turn, rule, route}]: the routing rules' choices
        out["system_prompt"] = version.config.get("system_prompt", "") if version else agent.system_prompt
        out["context_messages_before"] = (
            # tenant-bypass: the same session, same tenant.
            Message.all_tenants.filter(tenant_id=run.tenant_id, session_id=run.session_id,
                                       position__lt=messages[0].position).count()
            if messages else 0
        )
    return out


def _totals(rows: _RunRows, *, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace's ``totals``: counts of both kinds of model call, tokens and cost of every call."""
    all_attempts = [a for t in turns for a in (*t["compaction_calls"], *t["sampling_calls"], *t["attempts"])]
    return {
        "llm_calls": len(all_attempts),
        "retries": sum(1 for a in all_attempts if a["is_retry"]),
        "fallbacks": sum(1 for a in all_attempts if a["is_fallback"]),
        "compaction_calls": len(rows.compaction_calls),
        "sampling_calls": sum(len(t["sampling_calls"]) for t in turns),
        "tool_calls": len(rows.tools),
        "approvals": len(rows.approvals),
        "compactions": len(rows.compactions),
        "prompt_tokens": sum(c.prompt_tokens for c in rows.calls),
        "completion_tokens": sum(c.completion_tokens for c in rows.calls),
        "cost_usd": usd(sum(c.cost_usd_micros for c in rows.calls)),
    }


def run_trace(*, run: Run, admin: bool) -> dict[str, Any]:
    """The timeline of ``run``: its model turns, tool calls, approvals, compactions, retries,
    fallbacks and the final reply.

    Args:
        run: A run the caller may see (the console and the API check that first).
        admin: True for tenant admins (the console): adds the prompt of each turn (the
            messages newly sent to the model in it), the agent's system prompt, reasoning,
            provider names, the providers' own error text, the run's user, who decided each
            approval, and each model call's ``bodies`` (its model call record, when the tenant
            keeps them: :func:`_bodies`, else None). False (the run's user): those keys are
            absent; errors are plain sentences (``llm.errors.public_error_message``).

    Returns:
        ``{"run": {...}, "turns": [{turn, compactions: [...], compaction_calls: [...],
        attempts: [...], completion: {content, tool_calls[, reasoning]} | None,
        tool_calls: [...][, prompt: [...]]}], "totals": {llm_calls, retries, fallbacks,
        compaction_calls, tool_calls, approvals, compactions, prompt_tokens,
        completion_tokens, cost_usd}}``. Times are ISO 8601, durations ms, costs decimal USD
        strings. ``attempts``: the turn's model calls for its answer (purpose ``turn``);
        ``compaction_calls``: the summary requests of the compactions made before it (purpose
        ``compaction``), never counted as the answer's retries; ``sampling_calls``: MCP servers'
        sampling requests during its tool calls (purpose ``sampling``, also in ``totals.llm_calls``
        and ``totals.sampling_calls``). Each of these: ``{purpose,
        attempt, entry_index, model, status, error_class, error, latency_ms, first_token_ms,
        retry_wait_ms, prompt_tokens, completion_tokens, cost_usd, is_retry, is_fallback,
        at}``. ``totals.llm_calls``, ``retries`` and ``fallbacks`` count both kinds;
        tokens and cost count every call. Each tool call: ``{name,
        arguments, status, result, error, duration_ms, started_at, finished_at, server_log (an MCP
        server's log messages ``[{level, logger, data, at}]``), approval:
        {status, decided_at, wait_ms, decided_by_run_user, decided_on_timeout, on_timeout, approvers[,
        decided_by]} | None, sub_run}`` (``answer``: a denial's reason as the decider gave it).

    Queries: six (seven for ``admin``: the model call records), whatever the run's size. Reads only.
    """
    rows = _run_rows(run, admin=admin)
    turns, first_ats = _turns(rows, run=run, admin=admin)
    compaction_calls = rows.compaction_calls
    for compaction in rows.compactions:
        target = _compaction_turn(compaction, turns=turns, first_ats=first_ats, compaction_calls=compaction_calls)
        if target is not None:
            target["compactions"].append(_compaction(compaction))
    return {
        "run": _run_summary(run, messages=rows.messages, admin=admin),
        "turns": turns,
        "totals": _totals(rows, turns=turns),
    }
