"""The runner's database work: synchronous functions, called through :func:`db`.

Every function here expects the caller to have set the tenant scope (the runner does, from
the run row it claimed). Each is self-contained (its own transaction), so they may run on
any thread of the pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from channels.db import database_sync_to_async

from django.db import transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from agents.models import AgentInstance, CapabilityKind
from capabilities.mcp.client import McpServerConfig
from capabilities.models import McpServer
from llm.selectors import route_entries, route_entry_config
from llm.router import AttemptRecord
from llm.types import ChatMessage, ToolCallRequest
from sessions.models import (
    ChatSession,
    Compaction,
    LLMCall,
    Message,
    MessageRole,
    Run,
    RunStatus,
    ToolCall,
    ToolCallStatus,
)
from sessions.runner.spec import BrowserBindingSpec, BuiltinBindingSpec, McpBindingSpec, RunSpec
from tenants.crypto import secret_decrypt_json
from tenants.models import Tenant


T = TypeVar("T")


def db(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` as a coroutine function run on a worker thread with a pooled connection.

    Not thread-sensitive: the runs a worker hosts would otherwise queue behind one thread
    for every ORM call. The tenant ContextVar is copied into the thread.
    """
    return database_sync_to_async(fn, thread_sensitive=False)


class RunNotClaimable(Exception):
    """The run is finished, unknown, or must wait for an earlier run of its session."""


def run_tenant_id(run_id: int) -> int | None:
    # tenant-bypass: the run row decides the tenant the rest of the run is scoped to.
    return Run.all_tenants.filter(pk=run_id).values_list("tenant_id", flat=True).first()


@transaction.atomic
def run_claim(run_id: int) -> RunSpec:
    """Mark the run running (attempt + 1) and load everything it needs.

    A ``running`` run is claimed again: that is a redelivery after its worker died, and the
    run resumes from what it persisted.

    Raises:
        RunNotClaimable: finished, missing, or an earlier run of the session is active.
        ValueError: the agent's configuration is unusable (no route entries…).
    """
    from sessions.services import session_has_earlier_active_run

    run = Run.objects.select_related("session").filter(pk=run_id).first()
    if run is None:
        raise RunNotClaimable(f"run {run_id} not found")
    ChatSession.objects.select_for_update().get(pk=run.session_id)  # serialises runs of a session
    run = Run.objects.select_for_update().get(pk=run_id)  # a concurrent cancel of a queued run wins
    if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
        raise RunNotClaimable(f"run {run_id} is {run.status}")
    if session_has_earlier_active_run(run=run):
        raise RunNotClaimable(f"run {run_id} waits for an earlier run of its session")
    run.status = RunStatus.RUNNING
    run.attempt += 1
    run.started_at = run.started_at or timezone.now()
    run.save(update_fields=["status", "attempt", "started_at"])
    return _spec(run)


def _spec(run: Run) -> RunSpec:
    agent = AgentInstance.objects.select_related("route").get(pk=run.session.agent_id)
    tenant = Tenant.objects.get(pk=run.tenant_id)
    entries = route_entries(route_id=agent.route_id)
    if not entries:
        raise ValueError(f"the route {agent.route.name!r} of agent {agent.name!r} has no entries")
    configs = tuple(route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries))
    mcp_bindings: list[McpBindingSpec] = []
    builtins: dict[str, BuiltinBindingSpec] = {}
    browsers: list[BrowserBindingSpec] = []
    for binding in agent.bindings.filter(enabled=True).order_by("id"):
        if binding.kind == CapabilityKind.MCP_SERVER:
            server = McpServer.objects.get(pk=binding.mcp_server_id)
            if not server.enabled:
                continue
            mcp_bindings.append(
                McpBindingSpec(
                    server=McpServerConfig(
                        alias=server.alias,
                        transport=server.transport,
                        command=server.command,
                        args=tuple(server.args),
                        env=secret_decrypt_json(tenant=tenant, ciphertext=server.env_encrypted),
                        url=server.url,
                        headers=secret_decrypt_json(tenant=tenant, ciphertext=server.headers_encrypted),
                        connect_timeout_seconds=server.connect_timeout_seconds,
                    ),
                    allowed_tools=frozenset(binding.allowed_tools),
                    binding_id=binding.pk,
                    approval_policy=tuple(binding.approval_policy),
                )
            )
        elif binding.kind == CapabilityKind.BUILTIN:
            builtins.setdefault(binding.builtin_name, BuiltinBindingSpec(
                name=binding.builtin_name, binding_id=binding.pk, approval_policy=tuple(binding.approval_policy),
                config=dict(binding.config),
            ))
        elif binding.kind == CapabilityKind.BROWSER and not browsers:  # one browser per agent: the first binding
            browsers.append(BrowserBindingSpec(
                config=dict(binding.config), binding_id=binding.pk, approval_policy=tuple(binding.approval_policy),
            ))
    return RunSpec(
        run_id=run.pk,
        tenant_id=run.tenant_id,
        session_id=run.session_id,
        user_id=run.user_id,
        agent_name=agent.name,
        system_prompt=agent.system_prompt,
        max_loop_count=agent.max_loop_count,
        tool_max_parallel=agent.tool_max_parallel,
        tool_timeout_seconds=agent.tool_timeout_seconds,
        turn_timeout_seconds=agent.turn_timeout_seconds,
        max_tokens_per_run=agent.max_tokens_per_run,
        max_cost_per_run_usd_micros=(
            int(agent.max_cost_per_run_usd * 1_000_000) if agent.max_cost_per_run_usd is not None else None
        ),
        tenant_monthly_budget_usd_micros=(
            int(tenant.monthly_budget_usd * 1_000_000) if tenant.monthly_budget_usd is not None else None
        ),
        entries=configs,
        entry_ids=tuple(e.pk for e in entries),
        mcp_bindings=tuple(mcp_bindings),
        builtin_bindings=tuple(builtins.values()),
        browser_bindings=tuple(browsers),
        attempt=run.attempt,
        loop_count=run.loop_count,
    )


@dataclass(frozen=True, slots=True)
class History:
    """What a model turn is built from."""

    messages: list[ChatMessage]
    """The conversation after the latest compaction's cursor, in canonical form."""
    tail: ChatMessage | None
    """This run's last message if it is the assistant's (a resumed run continues from it)."""
    summary: str
    """The latest compaction's summary of everything before the cursor ("" if none)."""
    rows: list[Message]
    """The message rows behind ``messages`` (what a compaction may summarize)."""


def _after_cursor(compaction: Compaction | None) -> Q:
    if compaction is None or compaction.cursor_message_id is None:
        return Q()
    c = compaction.cursor_message
    return Q(run_id__gt=c.run_id) | Q(run_id=c.run_id, position__gt=c.position)


def latest_compaction(session_id: int) -> Compaction | None:
    return (
        Compaction.objects.select_related("cursor_message")
        .filter(session_id=session_id, status="succeeded").order_by("-id").first()
    )


def history_load(run_id: int) -> History:
    """The session's conversation up to and including this run: the latest compaction
    summary, then the messages after its cursor.

    Messages are ordered by run, then position: a message queued while an earlier run was
    still working has a lower position than that run's answer, but belongs after it.
    Earlier runs' unanswered tool calls (a run that failed between a call and its result)
    are dropped so that tool call/result pairs are never split; the current run's are kept,
    because the runner resumes by executing them.
    """
    run = Run.objects.get(pk=run_id)
    compaction = latest_compaction(run.session_id)
    rows = list(
        Message.objects.filter(_after_cursor(compaction), session_id=run.session_id, run_id__lte=run_id)
        .order_by("run_id", "position")
    )
    answered = {m.tool_call_id for m in rows if m.role == MessageRole.TOOL}
    out: list[ChatMessage] = []
    kept: list[Message] = []
    for m in rows:
        if m.role == MessageRole.ASSISTANT:
            calls = tuple(ToolCallRequest(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in m.tool_calls)
            if m.run_id != run_id:
                calls = tuple(c for c in calls if c.id in answered)
            if not calls and not m.content:
                continue
            out.append(ChatMessage(role="assistant", content=m.content, tool_calls=calls))
        elif m.role == MessageRole.TOOL:
            out.append(ChatMessage(role="tool", content=m.content, tool_call_id=m.tool_call_id, name=m.name))
        else:
            out.append(ChatMessage(role="user", content=m.content))
        kept.append(m)
    out = _results_in_call_order(out)
    tail = None
    if rows and rows[-1].run_id == run_id and out and out[-1].role == "assistant":
        tail = out[-1]
    return History(messages=out, tail=tail, summary=compaction.summary if compaction else "", rows=kept)


@transaction.atomic
def compaction_save(
    *, spec: RunSpec, attempt: int, status: str, summary: str = "", cursor_message_id: int | None = None,
    messages_summarized: int = 0, tokens_before: int = 0, tokens_after: int = 0, error: str = "",
) -> int:
    """Record a compaction attempt; a succeeded one moves the session's cursor. Returns its id."""
    row = Compaction.objects.create(
        tenant_id=spec.tenant_id, session_id=spec.session_id, run_id=spec.run_id, attempt=attempt, status=status,
        summary=summary, cursor_message_id=cursor_message_id, messages_summarized=messages_summarized,
        tokens_before=tokens_before, tokens_after=tokens_after, error=error[:5000],
    )
    return row.pk


def _results_in_call_order(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Tool results are stored as they finish; present them in the order of the calls."""
    out: list[ChatMessage] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        out.append(message)
        i += 1
        if message.role == "assistant" and message.tool_calls:
            order = {c.id: n for n, c in enumerate(message.tool_calls)}
            j = i
            while j < len(messages) and messages[j].role == "tool":
                j += 1
            out.extend(sorted(messages[i:j], key=lambda m: order.get(m.tool_call_id or "", len(order))))
            i = j
    return out


def _next_position(session_id: int) -> int:
    session = ChatSession.objects.select_for_update().get(pk=session_id)
    position = session.next_position
    session.next_position += 1
    session.save(update_fields=["next_position", "updated_at"])
    return position


@transaction.atomic
def assistant_message_save(
    *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str = ""
) -> list[dict[str, Any]]:
    """Persist an assistant message and its tool calls (pending); counts the turn.

    Returns:
        ``[{pk, call_id, name, arguments_raw}]`` for the tool calls, in the model's order.
    """
    Message.objects.create(
        tenant_id=spec.tenant_id, session_id=spec.session_id, run_id=spec.run_id,
        position=_next_position(spec.session_id), role=MessageRole.ASSISTANT, content=message.content,
        reasoning=reasoning, tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls],
    )
    Run.objects.filter(pk=spec.run_id).update(loop_count=turn + 1)
    calls = []
    for c in message.tool_calls:
        try:
            parsed: Any = c.parsed_arguments()
        except ValueError:
            parsed = {}
        row = ToolCall.objects.create(
            tenant_id=spec.tenant_id, run_id=spec.run_id, turn=turn, call_id=c.id, name=c.name,
            arguments=parsed, arguments_raw=c.arguments,
        )
        calls.append({"pk": row.pk, "call_id": c.id, "name": c.name, "arguments_raw": c.arguments})
    return calls


def pending_tool_calls(*, run_id: int, call_ids: list[str]) -> list[dict[str, Any]]:
    """Of ``call_ids``, the ToolCall rows of this run that have no result yet."""
    rows = ToolCall.objects.filter(run_id=run_id, call_id__in=call_ids).exclude(
        status__in=[ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED, ToolCallStatus.TIMED_OUT, ToolCallStatus.CANCELLED]
    )
    by_id = {r.call_id: r for r in rows}
    return [
        {"pk": by_id[c].pk, "call_id": c, "name": by_id[c].name, "arguments_raw": by_id[c].arguments_raw}
        for c in call_ids
        if c in by_id
    ]


def tool_call_start(*, pk: int) -> None:
    ToolCall.objects.filter(pk=pk).update(status=ToolCallStatus.RUNNING, started_at=timezone.now())


@transaction.atomic
def tool_call_finish(
    *, spec: RunSpec, pk: int, status: str, content: str, data: Any, error: str, duration_ms: int,
    model_content: str | None = None,
) -> bool:
    """Record a tool call's outcome and its tool message. Idempotent: False if already recorded.

    ``content`` is the result as the tool returned it (ToolCall.result, shown in the UI);
    ``model_content``, when given, is what the model reads instead (the tool message), e.g.
    the result framed as untrusted data.
    """
    call = ToolCall.objects.select_for_update().get(pk=pk)
    if call.finished_at is not None:
        return False
    call.status = status
    call.result = content if status == ToolCallStatus.SUCCEEDED else ""
    call.result_data = _jsonable(data)
    call.error = error
    call.finished_at = timezone.now()
    call.duration_ms = duration_ms
    call.save(update_fields=["status", "result", "result_data", "error", "finished_at", "duration_ms"])
    Message.objects.create(
        tenant_id=spec.tenant_id, session_id=spec.session_id, run_id=spec.run_id,
        position=_next_position(spec.session_id), role=MessageRole.TOOL,
        content=(model_content if model_content is not None else content) if status == ToolCallStatus.SUCCEEDED
        else f"Error: {error}",
        tool_call_id=call.call_id, name=call.name,
    )
    return True


def _jsonable(data: Any) -> Any:
    if data is None:
        return None
    try:
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return {"repr": repr(data)[:10_000]}


@transaction.atomic
def llm_call_record(*, spec: RunSpec, turn: int, record: AttemptRecord) -> None:
    """Write the LLMCall row and add its tokens and cost to the run's totals."""
    entry_id = spec.entry_ids[record.entry_index] if record.entry_index < len(spec.entry_ids) else None
    Run.objects.filter(pk=spec.run_id).update(
        prompt_tokens=F("prompt_tokens") + record.prompt_tokens,
        completion_tokens=F("completion_tokens") + record.completion_tokens,
        cost_usd_micros=F("cost_usd_micros") + record.cost_usd_micros,
    )
    LLMCall.objects.create(
        tenant_id=spec.tenant_id, run_id=spec.run_id, turn=turn, attempt=record.attempt,
        route_entry_id=entry_id, entry_index=record.entry_index, provider_name=record.provider_name,
        model=record.model, status=record.status, error_class=record.error_class or "",
        error=record.error[:5000], latency_ms=max(0, record.latency_ms),
        first_token_ms=record.first_token_ms, prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens, usage_estimated=record.usage_estimated,
        cost_usd_micros=record.cost_usd_micros, retry_wait_ms=record.retry_wait_ms,
    )


@dataclass(frozen=True, slots=True)
class Usage:
    tokens: int
    cost_usd_micros: int


def run_usage(run_id: int) -> Usage:
    run = Run.objects.values("prompt_tokens", "completion_tokens", "cost_usd_micros").get(pk=run_id)
    return Usage(tokens=run["prompt_tokens"] + run["completion_tokens"], cost_usd_micros=run["cost_usd_micros"])


def tenant_month_cost_usd_micros(tenant_id: int) -> int:
    """Micro-USD of the tenant's LLM calls since the start of this calendar month (UTC)."""
    from sessions.selectors import month_start

    total = LLMCall.objects.filter(created_at__gte=month_start()).aggregate(total=Sum("cost_usd_micros"))["total"]
    return int(total or 0)


@transaction.atomic
def run_finish(*, run_id: int, status: str, reply: str = "", error: str = "", reason: str = "") -> int | None:
    """Record the run's end. Returns the id of the session's next queued run, if any."""
    from sessions.services import next_queued_run_id

    run = Run.objects.select_for_update().get(pk=run_id)
    ChatSession.objects.select_for_update().get(pk=run.session_id)
    run.status = status
    run.reply = reply
    run.error = error[:5000]
    run.reason = reason
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "reply", "error", "reason", "finished_at"])
    # Calls left without a result (the run failed mid-turn) are recorded as cancelled.
    ToolCall.objects.filter(run_id=run_id, finished_at__isnull=True).update(
        status=ToolCallStatus.CANCELLED, finished_at=timezone.now()
    )
    return next_queued_run_id(session_id=run.session_id)
