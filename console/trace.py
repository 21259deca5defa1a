"""The run trace: everything one run did, turn by turn (a selector: reads only).

Used by the console's trace page (``admin=True``: every field) and by
``GET /api/v1/runs/<id>/trace/`` for the run's own user (``admin=False``: the fields a member
may see). The caller has already decided that the requester may see ``run``; every query
here is held to ``run.tenant_id`` as well.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from llm.errors import public_error_message
from llm.metering import LLMCallPurpose
from sessions.models import (
    Approval,
    Compaction,
    LLMCall,
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
    "decided_by", "context_messages_before",
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


def _message(m: Message, *, admin: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": m.pk, "position": m.position, "role": m.role, "content": m.content, "name": m.name,
        "tool_call_id": m.tool_call_id,
        "tool_calls": [{"name": c.get("name", ""), "arguments": c.get("arguments", "")} for c in (m.tool_calls or [])],
    }
    if admin:
        out["reasoning"] = m.reasoning
    return out


def _attempt(call: LLMCall, previous: LLMCall | None, *, admin: bool) -> dict[str, Any]:
    """One LLM call of the run as a trace row; ``previous``: the call before it that it may
    repeat (None: a first try), so the row is a retry on the same route entry or a fallback
    to another one."""
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
    return out


def _approval(a: Approval | None, *, admin: bool, run_user_id: int) -> dict[str, Any] | None:
    if a is None:
        return None
    out: dict[str, Any] = {
        "id": a.pk, "kind": a.kind, "status": a.status, "reason": a.reason, "question": a.question,
        "answer": a.answer, "created_at": _iso(a.created_at), "decided_at": _iso(a.decided_at),
        "expires_at": _iso(a.expires_at),
        "decided_by_run_user": a.decided_by_id is not None and a.decided_by_id == run_user_id,
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
        "approval": _approval(approvals.get(call.pk), admin=admin, run_user_id=run_user_id),
        "sub_run": None if sub is None else {
            "id": sub.pk, "status": sub.status, "skill": sub.skill.name if sub.skill is not None else call.name,
            "reply": sub.reply, "loop_count": sub.loop_count,
        },
    }


def _turn_attempts(calls: list[LLMCall], *, admin: bool) -> list[dict[str, Any]]:
    """A turn's ``turn``-purpose calls in order: every call after the first repeats the turn's
    request (a router retry or fallback, or the turn restarted after a broken stream or a
    compaction), so it is a retry or a fallback."""
    return [_attempt(c, calls[i - 1] if i else None, admin=admin) for i, c in enumerate(calls)]


def _compaction_calls(calls: list[LLMCall], *, admin: bool) -> list[dict[str, Any]]:
    """A turn's ``compaction``-purpose calls in order. Each compaction attempt is a new summary
    request (its first call has ``attempt`` 1, the router's count within one request), not a
    retry of the one before: only the router's later attempts within a request are retries
    or fallbacks."""
    return [_attempt(c, calls[i - 1] if i and c.attempt > 1 else None, admin=admin) for i, c in enumerate(calls)]


def _compaction(c: Compaction) -> dict[str, Any]:
    return {
        "id": c.pk, "attempt": c.attempt, "status": c.status, "messages_summarized": c.messages_summarized,
        "tokens_before": c.tokens_before, "tokens_after": c.tokens_after, "summary": c.summary, "error": c.error,
        "at": _iso(c.created_at),
    }


def run_trace(*, run: Run, admin: bool) -> dict[str, Any]:
    """The timeline of ``run``: its model turns, tool calls, approvals, compactions, retries,
    fallbacks and the final reply.

    Args:
        run: A run the caller may see (the console and the API check that first).
        admin: True for tenant admins (the console): adds the prompt of each turn (the
            messages newly sent to the model in it), the agent's system prompt, reasoning,
            provider names, the providers' own error text, the run's user, who decided each
            approval. False (the run's user): those keys are absent; errors are plain
            sentences (``llm.errors.public_error_message``).

    Returns:
        ``{"run": {...}, "turns": [{turn, compactions: [...], compaction_calls: [...],
        attempts: [...], completion: {content, tool_calls[, reasoning]} | None,
        tool_calls: [...][, prompt: [...]]}], "totals": {llm_calls, retries, fallbacks,
        compaction_calls, tool_calls, approvals, compactions, prompt_tokens,
        completion_tokens, cost_usd}}``. Times are ISO 8601, durations ms, costs decimal USD
        strings. ``attempts``: the turn's model calls for its answer (purpose ``turn``);
        ``compaction_calls``: the summary requests of the compactions made before it (purpose
        ``compaction``), never counted as the answer's retries. Each of either: ``{purpose,
        attempt, entry_index, model, status, error_class, error, latency_ms, first_token_ms,
        retry_wait_ms, prompt_tokens, completion_tokens, cost_usd, is_retry, is_fallback,
        at}``. ``totals.llm_calls``, ``retries`` and ``fallbacks`` count both kinds;
        tokens and cost count every call. Each tool call: ``{name,
        arguments, status, result, error, duration_ms, started_at, finished_at, approval:
        {status, decided_at, wait_ms, decided_by_run_user[, decided_by]} | None, sub_run}``.

    Queries: six, whatever the run's size. Reads only.
    """
    tenant_id = run.tenant_id
    # tenant-bypass: every query below names the run (already authorised) and its tenant.
    calls = list(LLMCall.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("turn", "created_at", "id"))
    tools = list(ToolCall.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("turn", "id"))
    approvals = {
        a.tool_call_id: a for a in Approval.all_tenants.filter(
            tenant_id=tenant_id, tool_call__run_id=run.pk,
        ).select_related("decided_by")
    }
    sub_runs = {
        r.parent_tool_call_id: r for r in Run.all_tenants.filter(
            tenant_id=tenant_id, parent_tool_call__run_id=run.pk,
        ).select_related("skill")
    }
    compactions = list(Compaction.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("id"))
    messages = list(Message.all_tenants.filter(tenant_id=tenant_id, run_id=run.pk).order_by("position"))

    # The k-th assistant message of the run is turn k's completion; the messages between the
    # previous assistant message and it are what was newly sent to the model in turn k.
    completions: list[Message] = []
    prompts: list[list[Message]] = [[]]
    for m in messages:
        if m.role == MessageRole.ASSISTANT:
            completions.append(m)
            prompts.append([])
        else:
            prompts[-1].append(m)

    compaction_calls = [c for c in calls if c.purpose == LLMCallPurpose.COMPACTION]
    turn_numbers = sorted({c.turn for c in calls} | {t.turn for t in tools} | set(range(len(completions))))
    turns = []
    for turn in turn_numbers:
        attempts = [c for c in calls if c.turn == turn and c.purpose != LLMCallPurpose.COMPACTION]
        first_at = attempts[0].created_at if attempts else None
        entry: dict[str, Any] = {
            "turn": turn,
            "attempts": _turn_attempts(attempts, admin=admin),
            "compaction_calls": _compaction_calls([c for c in compaction_calls if c.turn == turn], admin=admin),
            "completion": _message(completions[turn], admin=admin) if turn < len(completions) else None,
            "tool_calls": [
                _tool_call(t, admin=admin, run_user_id=run.user_id, approvals=approvals, sub_runs=sub_runs)
                for t in tools if t.turn == turn
            ],
            "compactions": [],
        }
        if admin:
            entry["prompt"] = [_message(m, admin=True) for m in prompts[turn]] if turn < len(prompts) else []
        entry["_first_at"] = first_at
        turns.append(entry)
    # A compaction happens before the model call of the turn that needed it: the turn of the
    # summary request saved just before it, else (no such call recorded) the first turn
    # answered after it.
    for c in compactions:
        made_by = max((k for k in compaction_calls if k.created_at <= c.created_at),
                      key=lambda k: (k.created_at, k.pk), default=None)
        target = next((t for t in turns if made_by is not None and t["turn"] == made_by.turn), None)
        if target is None:
            target = next((t for t in turns if t["_first_at"] is not None and t["_first_at"] >= c.created_at), None)
        if target is None and turns:
            target = turns[-1]
        if target is not None:
            target["compactions"].append(_compaction(c))
    for t in turns:
        del t["_first_at"]

    agent = run.session.agent
    run_out: dict[str, Any] = {
        "id": run.pk, "session_id": run.session_id, "status": run.status, "reason": run.reason,
        "reason_label": RunFailureReason(run.reason).label if run.reason in RunFailureReason.values else "",
        "error": run.error, "input": run.input, "reply": run.reply, "loop_count": run.loop_count,
        "agent": {"id": agent.pk, "name": agent.name},
        "parent_run_id": None, "depth": run.depth,
        "created_at": _iso(run.created_at), "started_at": _iso(run.started_at), "finished_at": _iso(run.finished_at),
        "duration_ms": _ms_between(run.started_at, run.finished_at),
        "paused_seconds": run.paused_seconds,
        # What bound capabilities added to the model input at the run's start (knowledge passages, memories).
        "context": [{"source": b.get("source", ""), "title": b.get("title", ""), "text": b.get("text", ""),
                     "data": b.get("data")} for b in (run.context or []) if isinstance(b, dict)],
    }
    if run.parent_tool_call_id:
        # tenant-bypass: the parent's tool call, in the same tenant.
        run_out["parent_run_id"] = ToolCall.all_tenants.filter(
            tenant_id=tenant_id, pk=run.parent_tool_call_id).values_list("run_id", flat=True).first()
    if admin:
        run_out["user"] = run.user.get_username()
        run_out["worker_attempts"] = run.attempt
        run_out["system_prompt"] = agent.system_prompt
        run_out["context_messages_before"] = (
            # tenant-bypass: the same session, same tenant.
            Message.all_tenants.filter(tenant_id=tenant_id, session_id=run.session_id,
                                       position__lt=messages[0].position).count()
            if messages else 0
        )
    all_attempts = [a for t in turns for a in (*t["compaction_calls"], *t["attempts"])]
    totals = {
        "llm_calls": len(all_attempts),
        "retries": sum(1 for a in all_attempts if a["is_retry"]),
        "fallbacks": sum(1 for a in all_attempts if a["is_fallback"]),
        "compaction_calls": len(compaction_calls),
        "tool_calls": len(tools),
        "approvals": len(approvals),
        "compactions": len(compactions),
        "prompt_tokens": sum(c.prompt_tokens for c in calls),
        "completion_tokens": sum(c.completion_tokens for c in calls),
        "cost_usd": usd(sum(c.cost_usd_micros for c in calls)),
    }
    return {"run": run_out, "turns": turns, "totals": totals}
