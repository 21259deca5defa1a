"""The runner's reads: a run's tenant, its configuration (the agent, route entries and
bindings, loaded right after the claim), its history, its usage for the budgets, the calls
and approvals a resumed run continues from, the images its user messages reference, its
start context and tool results (and the writes of its start context and attributions, which
are no transitions), and a sub-run's configuration. Used through
:class:`sessions.runner.adapters.DatabaseRunStore`.

Writes (every status transition and every row a run writes) are :mod:`sessions.runs`'.

- the history read, the usage and the tenant's month cost (``async def``) are plain SQL on the run's event loop,
  through its async psycopg pool (:mod:`sessions.runner.pg`); awaited directly;
- the rest (plain ``def``) are ORM code, called through
  :func:`sessions.runner.threads.db` on one of a few threads beside the loop.

Every function here expects the caller to have set the tenant scope (the runner does, from
the run row it claimed), and filters by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection

from agent_platform.model_rows import instances, select_all_sql
from agents.models import AgentInstance, AgentVersion, CapabilityBinding
from agents.routing import rules_compile
from agents.versions import version_materialize, version_route_entries
from capabilities.registry import binding_specs
from guardrails.models import Guardrail
from guardrails.specs import specs_of_config, specs_of_rows
from llm.models import ModelProvider, ModelRoute, ModelRouteEntry
from llm.selectors import route_entries, route_entry_config
from llm.types import IMAGE_MIME_TYPES, ChatMessage, ToolCallRequest
from sessions.models import (
    Approval,
    Artifact,
    ChatSession,
    Compaction,
    Message,
    MessageRole,
    Run,
    ToolCall,
    ToolCallStatus,
    UsageMonth,
)
from sessions.runner.pg import pg_connection
from sessions.runner.ports import ArtifactImage
from sessions.runner.spec import RunRequestOptions, RunSpec
from sessions.runner.threads import db, db_executor_shutdown
from sessions.runs import ClaimedRun
from tenants.models import Tenant
from tenants.scoping import require_tenant_id, system_scope

__all__ = ["ClaimedRun", "db", "db_executor_shutdown"]  # (the runner's tests use them from here)

_RUN, _SESSION, _TENANT = Run._meta.db_table, ChatSession._meta.db_table, Tenant._meta.db_table
_M, _TC = Message._meta.db_table, ToolCall._meta.db_table


async def run_tenant_id(run_id: int) -> int | None:
    """The tenant of the run (None: no such run)."""
    # tenant-bypass: the run row decides the tenant the rest of the run is scoped to.
    with system_scope():
        async with pg_connection() as conn:
            cursor = await conn.execute(f'SELECT "tenant_id" FROM "{_RUN}" WHERE "id" = %s', [run_id])
            row = await cursor.fetchone()
    return row[0] if row else None


_SPEC_ROUTE_SQL = f'SELECT "route_id" FROM "{AgentInstance._meta.db_table}" WHERE "id" = %s AND "tenant_id" = %s'
_SPEC_ENTRY_PROVIDERS_SQL = (
    f'SELECT "provider_id" FROM "{ModelRouteEntry._meta.db_table}" WHERE "route_id" = ({_SPEC_ROUTE_SQL}) AND "tenant_id" = %s'
)
_SPEC_SQL = (
    (AgentInstance, f'{select_all_sql(AgentInstance)} WHERE "id" = %s AND "tenant_id" = %s'),
    (Tenant, f'{select_all_sql(Tenant)} WHERE "id" = %s'),
    (ModelRouteEntry, (
        f'{select_all_sql(ModelRouteEntry)} WHERE "route_id" = ({_SPEC_ROUTE_SQL}) AND "tenant_id" = %s '
        'ORDER BY "position", "id"'
    )),
    (ModelProvider, f'{select_all_sql(ModelProvider)} WHERE "id" IN ({_SPEC_ENTRY_PROVIDERS_SQL}) AND "tenant_id" = %s'),
    (CapabilityBinding, (
        f'{select_all_sql(CapabilityBinding)} WHERE "agent_id" = %s AND "tenant_id" = %s AND "enabled" ORDER BY "id"'
    )),
    (Guardrail, (
        f'{select_all_sql(Guardrail)} WHERE "agent_id" = %s AND "tenant_id" = %s AND "enabled" '
        'ORDER BY "point", "position", "id"'
    )),
)
"""The six reads of :func:`_spec_rows`, each with the model its rows are; none needs another's
result (the route and the providers are found by subqueries), so all go in one round trip."""


def _spec_params(run: ClaimedRun) -> tuple[list[int], ...]:
    agent, tenant = run.agent_id, run.tenant_id
    return [agent, tenant], [tenant], [agent, tenant, tenant], [agent, tenant, tenant, tenant], [agent, tenant], [agent, tenant]


def _spec_rows(run: ClaimedRun) -> tuple[AgentInstance, Tenant, list[ModelRouteEntry], list[CapabilityBinding],
                                         tuple[Any, ...]]:
    """The agent, tenant, route entries (providers attached, in route order) and enabled
    bindings (by id) a run's configuration is built from, and its enabled guardrails (in run order).

    Six hand-written statements, each filtered by the run's tenant, sent in one psycopg
    pipeline (one round trip) on the thread's Django connection, after a Django cursor has
    applied the tenant scope to it (:mod:`agent_platform.postgresql`); rows become instances
    through the fields' converters and ``Model.from_db``, as the ORM's own do. On a thread
    that shares the GIL with the run loop, the equivalent querysets cost ~5 ms of CPU per run
    in query building (session 6), five ``RawQuerySet`` reads one after another ~0.7 ms, this
    ~0.27 ms (session 13; bench/README.md). Rare extras (an MCP server, a CLI command, a
    skill, the route's name for an error) are read lazily by the ORM, as before.

    Raises:
        AgentInstance.DoesNotExist, Tenant.DoesNotExist: the run's agent or tenant is gone.
        ValueError: a route entry's provider is not in the run's tenant.
    """
    with connection.cursor():  # opens the connection and sets its tenant scope
        pg = connection.connection
        with pg.pipeline():
            cursors = []
            for (_model, sql), params in zip(_SPEC_SQL, _spec_params(run), strict=False):
                cursor = pg.cursor()
                cursor.execute(sql, params)
                cursors.append(cursor)
            results = [instances(model, cursor.fetchall()) for (model, _sql), cursor in zip(_SPEC_SQL, cursors, strict=False)]
    agents, tenants, entries, providers_found, bindings, guardrails = results
    if not agents:
        raise AgentInstance.DoesNotExist(f"agent {run.agent_id} of tenant {run.tenant_id}")
    if not tenants:
        raise Tenant.DoesNotExist(f"tenant {run.tenant_id}")
    providers = {p.pk: p for p in providers_found}
    for entry in entries:
        if entry.provider_id not in providers:
            raise ValueError(f"the provider of route entry {entry.pk} is not in the run's tenant")
        entry.provider = providers[entry.provider_id]
    return agents[0], tenants[0], entries, bindings, specs_of_rows(guardrails)


def _spec_of_version(run: ClaimedRun, agent: AgentInstance, entries: list[ModelRouteEntry],
                     bindings: list[CapabilityBinding]) -> tuple[AgentInstance, list[ModelRouteEntry], list[CapabilityBinding]]:
    """The run's agent version when it is not the draft the rows above are (a published one
    behind the draft, ``slug@n``): its fields, route entries (as the version pinned them:
    :func:`agents.versions.version_route_entries`; a version from before they were pinned: its
    route's live ones) and bindings (:func:`agents.versions.version_materialize`). Read once per
    run attempt, at the claim."""
    version = AgentVersion.all_tenants.get(pk=run.agent_version_id, tenant_id=run.tenant_id)
    pinned, pinned_bindings = version_materialize(version, agent, bindings)
    pinned_entries = version_route_entries(version, tenant_id=run.tenant_id, live_entries=entries)
    if pinned_entries is not None:  # the route's entries as the version recorded them
        return pinned, pinned_entries, pinned_bindings
    if pinned.route_id != agent.route_id:
        entries = list(ModelRouteEntry.all_tenants.filter(route_id=pinned.route_id, tenant_id=run.tenant_id)
                       .select_related("provider").order_by("position", "id"))
        if any(e.provider.tenant_id != run.tenant_id for e in entries):
            raise ValueError(f"a provider of route {pinned.route_id} is not in the run's tenant")
    return pinned, entries, pinned_bindings


def _guardrails_of_version(run: ClaimedRun) -> tuple[Any, ...]:
    """The enabled guardrails of the run's version's snapshot (``config["guardrails"]``; none in a
    version saved before guardrails existed). One read of that key, for a run not on the draft."""
    items = (AgentVersion.all_tenants.filter(pk=run.agent_version_id, tenant_id=run.tenant_id)
             .values_list("config__guardrails", flat=True).first())
    return specs_of_config(items or ())


def _spec(run: ClaimedRun) -> RunSpec:
    """The RunSpec of a just-claimed run: its agent, limits, route entries and the specs of its
    enabled bindings, each loaded by its capability kind (:func:`capabilities.registry.binding_specs`)."""
    agent, tenant, entries, bindings, guardrails = _spec_rows(run)
    if run.agent_version_id is not None and run.agent_version_id != agent.draft_version_id:
        agent, entries, bindings = _spec_of_version(run, agent, entries, bindings)
        guardrails = _guardrails_of_version(run)
    if not entries:
        raise ValueError(f"the route {agent.route.name!r} of agent {agent.name!r} has no entries")
    configs = tuple(route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries))
    rules, routes, route_name = _routing(agent, tenant) if agent.routing_rules else ((), None, "")
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
        bindings=binding_specs(bindings),
        attempt=run.attempt,
        loop_count=run.loop_count,
        run_timeout_seconds=agent.run_timeout_seconds,
        steer=agent.message_mode == "steer",
        run_started_at=run.started_at.timestamp(),
        run_paused_seconds=run.paused_seconds,
        agent_id=agent.pk,
        request_options=RunRequestOptions.from_json(run.request_options),
        guardrails=guardrails,
        output_schema=agent.output_schema,
        output_repairs=agent.output_repairs,
        routing_rules=rules,
        routes=routes,
        route_name=route_name,
        record_llm_bodies=tenant.record_llm_bodies,
        purpose=run.purpose,
    )


def _routing(agent: AgentInstance, tenant: Tenant) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    """The agent's routing rules (compiled), the routes they name (``{name: (entry configs,
    entry ids)}``, each read in the agent's tenant only: a rule naming a route the tenant does
    not have, or one without entries, is left out) and the agent's own route's name. Read once
    per run attempt, only for agents with rules."""
    rules = rules_compile(agent.routing_rules)
    names = {r.route for r in rules}
    found = (ModelRouteEntry.all_tenants.filter(tenant_id=tenant.pk, route__tenant_id=tenant.pk, route__name__in=names)
             .select_related("provider", "route").order_by("route_id", "position", "id"))
    by_route: dict[str, list[ModelRouteEntry]] = {}
    for entry in found:
        if entry.provider.tenant_id == tenant.pk:
            by_route.setdefault(entry.route.name, []).append(entry)
    routes = {name: (tuple(route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries)),
                     tuple(e.pk for e in entries)) for name, entries in by_route.items()}
    route_name = ModelRoute.all_tenants.filter(pk=agent.route_id, tenant_id=tenant.pk).values_list("name", flat=True).first()
    return tuple(r for r in rules if r.route in routes), routes, route_name or ""


@dataclass(frozen=True, slots=True)
class History:
    """What a model turn is built from."""

    messages: list[ChatMessage]
    """The conversation after the latest compaction's cursor, in canonical form."""
    tail: ChatMessage | None
    """This run's last assistant message if nothing but its tool results follows it and it is
    either the last message or has calls without a result (a resumed run continues from it)."""
    summary: str
    """The latest compaction's summary of everything before the cursor ("" if none)."""
    rows: list[HistoryRow]
    """The message rows behind ``messages`` (what a compaction may summarize)."""
    compaction: CompactionCursor | None = None
    """The compaction the history starts after (pass it to the next :func:`history_load` of
    the same run until the run compacts again)."""


def _effective_run(message: HistoryRow) -> int:
    """The run a message belongs to in the conversation: a steered message joins the run it was handed to."""
    return message.effective_run


@dataclass(frozen=True, slots=True)
class CompactionCursor:
    """The latest succeeded compaction of a session, as a history needs it."""

    summary: str
    effective_run: int | None
    """The run (a steered message: the run it joined) of the last message summarized; None: no cursor."""
    position: int | None
    """That message's position."""


_LATEST_COMPACTION_SQL = (
    f'SELECT c."summary", m."run_id", r."steered_into_id", m."position" FROM "{Compaction._meta.db_table}" c '
    f'LEFT JOIN "{_M}" m ON m."id" = c."cursor_message_id" '
    f'LEFT JOIN "{_RUN}" r ON r."id" = m."run_id" '
    'WHERE c."session_id" = %(session_id)s AND c."tenant_id" = %(tenant_id)s AND c."status" = %(succeeded)s '
    'ORDER BY c."id" DESC LIMIT 1'
)
"""The session's latest succeeded compaction and its cursor message's run and position."""


async def latest_compaction(conn: Any, session_id: int) -> CompactionCursor | None:
    """The session's latest succeeded compaction (one query, four columns), or None.
    ``conn``: an async psycopg connection (:func:`~sessions.runner.pg.pg_connection`)."""
    cursor = await conn.execute(_LATEST_COMPACTION_SQL, {
        "session_id": session_id, "tenant_id": require_tenant_id(), "succeeded": "succeeded",
    })
    row = await cursor.fetchone()
    if row is None:
        return None
    summary, run_id, steered_into_id, position = row
    return CompactionCursor(summary=summary, effective_run=steered_into_id or run_id, position=position)


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """The columns of a Message row that a history needs (read-only; attribute names as on
    :class:`~sessions.models.Message`). Plain tuples from the database instead of model
    instances: at 500 turns (1,000 rows) model construction was most of ``history_load``'s
    CPU (bench/storage.py)."""

    pk: int
    run_id: int
    position: int
    role: str
    content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str
    name: str
    effective_run: int
    """The run it belongs to in the conversation (a steered message: the run it joined)."""

    @property
    def id(self) -> int:
        return self.pk


HISTORY_FIELDS = ("id", "run_id", "position", "role", "content", "tool_calls", "tool_call_id", "name", "effective_run")
"""The Message columns of a :class:`HistoryRow`, in its field order."""


_HISTORY_COLUMNS = 'm."id", m."run_id", m."position", m."role", m."content", m."tool_calls", m."tool_call_id", m."name"'
_EFFECTIVE_RUN = 'COALESCE(r."steered_into_id", m."run_id")'
_HISTORY_SQL = (
    f"SELECT {_HISTORY_COLUMNS}, {_EFFECTIVE_RUN} AS effective_run "
    f'FROM "{_M}" m INNER JOIN "{_RUN}" r ON r."id" = m."run_id" '
    'WHERE m."tenant_id" = %(tenant_id)s AND m."session_id" = %(session_id)s AND r."parent_tool_call_id" IS NULL '
    f"AND {_EFFECTIVE_RUN} <= %(run_id)s {{after_cursor}}"
    'ORDER BY effective_run, m."position"'
)
"""A user's run's history (:func:`history_load`): the session's messages up to this run,
without sub-runs' (columns in :data:`HISTORY_FIELDS` order)."""
_HISTORY_AFTER_CURSOR = (
    f"AND ({_EFFECTIVE_RUN} > %(cursor_run)s "
    f'OR ({_EFFECTIVE_RUN} = %(cursor_run)s AND m."position" > %(cursor_position)s)) '
)
_HISTORY_SUBRUN_SQL = (
    f'SELECT {_HISTORY_COLUMNS}, m."run_id" AS effective_run FROM "{_M}" m '
    'WHERE m."tenant_id" = %(tenant_id)s AND m."run_id" = %(run_id)s ORDER BY m."position"'
)


_RUN_SESSION_SQL = (
    f'SELECT "session_id", "parent_tool_call_id" FROM "{_RUN}" '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
)

_LOAD = object()
"""``history_load(compaction=…)`` default: read the latest compaction."""


async def history_load(
    run_id: int, *, session_id: int | None = None, subrun: bool | None = None, compaction: Any = _LOAD,
) -> History:
    """The session's conversation up to and including this run: the latest compaction
    summary, then the messages after its cursor.

    Messages are ordered by run, then position: a message queued while an earlier run was
    still working has a lower position than that run's answer, but belongs after it. A
    message *steered* into a running run (agent ``message_mode`` steer) counts as that run's,
    at its position. Messages of sub-runs (skills) are left out: the parent sees only the
    skill tool's result; a sub-run's history is its own messages (task first). Earlier runs'
    unanswered tool calls (a run that failed between a call and its result) are dropped so
    that tool call/result pairs are never split; the current run's are kept, because the
    runner resumes by executing them.

    ``session_id`` and ``subrun`` (whether the run is a skill's sub-run), when the caller
    knows them (the runner: from its RunSpec), spare a query per turn; so does ``compaction``
    (the previous history's :attr:`History.compaction`: the cursor moves only when this run
    compacts, as a session's runs never overlap and sub-runs never compact).

    Reads on the loop's async connection, all of it from one connection (up to three
    statements: the run, the latest compaction, the messages).

    Raises:
        Run.DoesNotExist: no such run in the current tenant (when ``session_id`` or
            ``subrun`` is not given).
    """
    tenant_id = require_tenant_id()
    async with pg_connection() as conn:
        if session_id is None or subrun is None:
            session_id, subrun = await _run_session(conn, run_id, tenant_id)
        sql, params, compaction = await _history_statement(
            conn, run_id=run_id, tenant_id=tenant_id, session_id=session_id, subrun=subrun, compaction=compaction,
        )
        cursor = await conn.execute(sql, params)
        rows = [
            HistoryRow(pk, run, position, role, content, json.loads(tool_calls), tool_call_id, name, effective_run)
            for pk, run, position, role, content, tool_calls, tool_call_id, name, effective_run in await cursor.fetchall()
        ]
    answered = {m.tool_call_id for m in rows if m.role == MessageRole.TOOL}
    out, kept = _conversation(rows, run_id=run_id, answered=answered)
    out = _results_in_call_order(out)
    return History(messages=out, tail=_resumable_tail(out, kept, run_id=run_id, answered=answered),
                   summary=compaction.summary if compaction else "", rows=kept, compaction=compaction)


async def _run_session(conn: Any, run_id: int, tenant_id: int) -> tuple[int, bool]:
    """The run's session and whether it is a sub-run. Raises Run.DoesNotExist."""
    cursor = await conn.execute(_RUN_SESSION_SQL, {"run_id": run_id, "tenant_id": tenant_id})
    found = await cursor.fetchone()
    if found is None:
        raise Run.DoesNotExist(f"run {run_id} not found")
    return found[0], found[1] is not None


async def _history_statement(
    conn: Any, *, run_id: int, tenant_id: int, session_id: int, subrun: bool, compaction: Any,
) -> tuple[str, dict[str, Any], CompactionCursor | None]:
    """The history's statement and parameters, and the compaction it starts after (read
    here when ``compaction`` is ``_LOAD``)."""
    if subrun:  # a sub-run: its own messages only, never compacted
        return _HISTORY_SUBRUN_SQL, {"tenant_id": tenant_id, "run_id": run_id}, None
    # a user's run: sub-runs' messages are not part of the session's conversation
    if compaction is _LOAD:
        compaction = await latest_compaction(conn, session_id)
    params: dict[str, Any] = {"tenant_id": tenant_id, "session_id": session_id, "run_id": run_id}
    if compaction is None or compaction.effective_run is None:
        return _HISTORY_SQL.format(after_cursor=""), params, compaction
    params.update(cursor_run=compaction.effective_run, cursor_position=compaction.position)
    return _HISTORY_SQL.format(after_cursor=_HISTORY_AFTER_CURSOR), params, compaction


def _conversation(
    rows: list[HistoryRow], *, run_id: int, answered: set[str],
) -> tuple[list[ChatMessage], list[HistoryRow]]:
    """``rows`` as chat messages, and the rows kept: earlier runs' unanswered tool calls are
    dropped (an assistant message left with neither calls nor text goes with them)."""
    out: list[ChatMessage] = []
    kept: list[HistoryRow] = []
    for m in rows:
        if m.role == MessageRole.ASSISTANT:
            calls = tuple(ToolCallRequest(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in m.tool_calls)
            if _effective_run(m) != run_id:
                calls = tuple(c for c in calls if c.id in answered)
            if not calls and not m.content:
                continue
            out.append(ChatMessage(role="assistant", content=m.content, tool_calls=calls))
        elif m.role == MessageRole.TOOL:
            out.append(ChatMessage(role="tool", content=m.content, tool_call_id=m.tool_call_id, name=m.name))
        else:
            out.append(ChatMessage(role="user", content=m.content))
        kept.append(m)
    return out, kept


def _resumable_tail(
    out: list[ChatMessage], kept: list[HistoryRow], *, run_id: int, answered: set[str],
) -> ChatMessage | None:
    """This run's last assistant message, when only its own tool results follow it: a resumed
    run continues from it, with its answer, or with its calls that have no result yet (a
    worker died mid-turn next to finished calls; an approved call next to an allowed one).
    Tool results only move among themselves in _results_in_call_order, so ``kept`` still
    lines up with ``out``."""
    last = len(out) - 1
    while last >= 0 and out[last].role == "tool":
        last -= 1
    if last >= 0 and out[last].role == "assistant" and _effective_run(kept[last]) == run_id:
        if last == len(out) - 1 or any(c.id not in answered for c in out[last].tool_calls):
            return out[last]
    return None


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


@dataclass(frozen=True, slots=True)
class Usage:
    tokens: int
    cost_usd_micros: int


_RUN_USAGE_SQL = (
    f'SELECT r."prompt_tokens" + r."completion_tokens", r."cost_usd_micros", t."run_id" FROM "{_RUN}" r '
    f'LEFT JOIN "{_TC}" t ON t."id" = r."parent_tool_call_id" '
    'WHERE r."id" = %(run_id)s AND r."tenant_id" = %(tenant_id)s'
)


async def run_usage(run_id: int) -> Usage:
    """Tokens and cost the run has used so far, for its per-run budgets.

    For a sub-run: its own plus its ancestors' (a run's totals include its sub-runs only once
    they ended), so a skill spends from the budget of the user's run that called it.

    Raises:
        Run.DoesNotExist: no such run (or ancestor) in the current tenant.
    """
    tokens = cost = 0
    next_id: int | None = run_id
    async with pg_connection() as conn:
        while next_id is not None:
            cursor = await conn.execute(_RUN_USAGE_SQL, {"run_id": next_id, "tenant_id": require_tenant_id()})
            row = await cursor.fetchone()
            if row is None:
                raise Run.DoesNotExist(f"run {next_id} not found")
            tokens += row[0]
            cost += row[1]
            next_id = row[2]
    return Usage(tokens=tokens, cost_usd_micros=cost)


_MONTH_COST_SQL = (
    f'SELECT coalesce(sum("cost_usd_micros"), 0)::bigint FROM "{UsageMonth._meta.db_table}" '
    'WHERE "tenant_id" = %(tenant_id)s AND "month" = %(month)s'
)


async def tenant_month_cost_usd_micros(tenant_id: int) -> int:
    """Micro-USD of the tenant's LLM calls since the start of this calendar month (UTC): every
    purpose (run turns, chat titles, memory, query rewrites, reranks) and purged chats' calls.

    The month's :class:`~sessions.models.UsageMonth` rows summed (at most 8, whatever the
    number of calls), in one statement on the loop's pool; the same figure as
    :func:`sessions.selectors.tenant_month_cost_usd_micros`.

    Raises:
        ValueError: ``tenant_id`` is not the current tenant scope's (row-level security would
            show no rows, so the budget would pass unchecked).
    """
    from sessions.selectors import month_start

    if tenant_id != require_tenant_id():
        raise ValueError(f"month cost of tenant {tenant_id} asked in tenant {require_tenant_id()}'s scope")
    async with pg_connection() as conn:
        cursor = await conn.execute(_MONTH_COST_SQL, {"tenant_id": tenant_id, "month": month_start().date()})
        row = await cursor.fetchone()
    return int(row[0])


@dataclass(frozen=True, slots=True)
class ApprovalState:
    approval_id: int
    kind: str
    status: str
    answer: str
    elicitation: Any = None
    """Kind ``elicitation``: ``{request, action, content}`` (``Approval.elicitation``)."""


def approvals_for_calls(*, call_pks: list[int]) -> dict[int, ApprovalState]:
    """``{tool call pk: ApprovalState}`` for the calls that have an approval (any status).

    By call only: a sub-run's approvals belong to the user's run (``Approval.run``)."""
    return {
        a.tool_call_id: ApprovalState(approval_id=a.pk, kind=a.kind, status=a.status, answer=a.answer,
                                      elicitation=a.elicitation)
        for a in Approval.objects.filter(tool_call_id__in=call_pks)
    }


async def session_has_artifacts(session_id: int) -> bool:
    """Whether any artifact belongs to the session (the runner then offers ``read_artifact``)."""
    async with pg_connection() as conn:
        cursor = await conn.execute(
            f'SELECT EXISTS (SELECT 1 FROM "{Artifact._meta.db_table}" WHERE "session_id" = %s AND "tenant_id" = %s)',
            [session_id, require_tenant_id()],
        )
        return (await cursor.fetchone())[0]


# --- images and the run's start context and attributions ----------------------------------------

_IMAGES_SQL = (
    'SELECT "id", "mime_type", "size_bytes", '
    'CASE WHEN "size_bytes" <= %(limit)s AND "mime_type" = ANY(%(types)s) THEN "content" END '
    f'FROM "{Artifact._meta.db_table}" '
    'WHERE "tenant_id" = %(tenant_id)s AND "session_id" = %(session_id)s AND "id" = ANY(%(ids)s)'
)
"""The session's artifacts among some ids, with their bytes only when they will be sent."""


async def images_load(*, session_id: int, artifact_ids: list[int], max_bytes: int) -> list[ArtifactImage]:
    """The store's ``images_load`` (:meth:`sessions.runner.ports.RunStore.images_load`): one
    statement on the loop's connection; bytes read only for images models take
    (:data:`llm.types.IMAGE_MIME_TYPES`) of at most ``max_bytes``."""
    async with pg_connection() as conn:
        cursor = await conn.execute(_IMAGES_SQL, {
            "limit": max_bytes, "types": sorted(IMAGE_MIME_TYPES), "tenant_id": require_tenant_id(),
            "session_id": session_id, "ids": artifact_ids,
        })
        rows = await cursor.fetchall()
    return [ArtifactImage(pk, mime_type, size, None if data is None else bytes(data))
            for pk, mime_type, size, data in rows]


def run_context_load(run_id: int) -> tuple[list[Any] | None, str]:
    """``(Run.context, Run.input)`` of run ``run_id`` (``([], "")`` for no such run). ORM: on a
    database thread."""
    row = Run.objects.filter(pk=run_id).values_list("context", "input").first()
    if row is None:
        return [], ""
    return row[0], row[1]


def run_context_save(run_id: int, blocks: list[dict[str, Any]]) -> None:
    """Store ``blocks`` as the run's context unless an earlier attempt already did. ORM."""
    Run.objects.filter(pk=run_id, context__isnull=True).update(context=blocks)


def tool_results(run_id: int) -> list[tuple[str, Any]]:
    """``[(exposed name, result_data)]`` of run ``run_id``'s succeeded tool calls with data,
    oldest first. ORM."""
    return list(ToolCall.objects.filter(run_id=run_id, status=ToolCallStatus.SUCCEEDED, result_data__isnull=False)
                .order_by("pk").values_list("name", "result_data"))


def attributions_save(run_id: int, attributions: list[dict[str, Any]]) -> None:
    """Store ``attributions`` as the run's (``Run.attributions``). ORM."""
    Run.objects.filter(pk=run_id).update(attributions=attributions)


_ROUTE_CHOICE_SQL = (
    f'UPDATE "{_RUN}" SET "routing" = COALESCE("routing", \'[]\'::jsonb) || %(choice)s::jsonb '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
)


async def route_choice_save(run_id: int, *, turn: int, rule: str, route: str) -> None:
    """Append ``{turn, rule, route}`` to the run's ``routing`` (the routing rule that chose the
    model route from turn ``turn`` on; ``rule`` "": none matched, the agent's own route). One
    statement on the loop's connection; only runs of agents with routing rules write it."""
    choice = json.dumps([{"turn": turn, "rule": rule, "route": route}])
    async with pg_connection() as conn:
        await conn.execute(_ROUTE_CHOICE_SQL, {"choice": choice, "run_id": run_id, "tenant_id": require_tenant_id()})


def structured_save(run_id: int, value: Any) -> None:
    """Store a completed run's parsed JSON answer as ``Run.structured`` (runs with an output format). ORM."""
    Run.objects.filter(pk=run_id).update(structured=value)


# --- sub-runs (skills) -------------------------------------------------------------------------


def subrun_spec(*, subrun_id: int, parent: RunSpec) -> RunSpec:
    """The RunSpec of a sub-run: the skill's instructions, loop limit and route (else the
    parent's entries); the parent's timeouts, parallelism, budgets and run deadline.

    Raises:
        ValueError: the skill was deleted, or its route has no entries.
    """
    run = Run.objects.select_related("skill").get(pk=subrun_id)
    skill = run.skill
    if skill is None and run.agent_version_id is not None:
        return _sub_agent_spec(run, parent)
    if skill is None:
        raise ValueError("The skill of this sub-run no longer exists.")
    if skill.model_route_id is not None:
        tenant = Tenant.objects.get(pk=run.tenant_id)
        entries = route_entries(route_id=skill.model_route_id)
        if not entries:
            raise ValueError(f"The model route of skill {skill.name!r} has no entries.")
        configs = tuple(route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries))
        entry_ids = tuple(e.pk for e in entries)
    else:
        configs, entry_ids = parent.entries, parent.entry_ids
    import dataclasses

    return dataclasses.replace(
        parent, run_id=run.pk, system_prompt=skill.instructions, max_loop_count=skill.max_loop_count,
        entries=configs, entry_ids=entry_ids, bindings=(),
        depth=run.depth, parent_run_id=parent.run_id, user_run_id=parent.waiting_run_id, attempt=run.attempt,
        loop_count=run.loop_count,
        # The agent's output format and routing rules are its user's run's: a skill answers in its own words.
        output_schema=None, routing_rules=(), routes=None,
        request_options=dataclasses.replace(parent.request_options, response_format=None),
    )


def _sub_agent_spec(run: Run, parent: RunSpec) -> RunSpec:
    """The RunSpec of a sub-agent's sub-run (capability kind ``agent``): the agent's own
    configuration at the sub-run's version (``Run.agent_version``: prompt, route, limits,
    bindings), as a user's run of it would load it (:func:`_spec`); the budgets (tokens,
    cost, tenant month) and the run deadline are the parent's, so the sub-agent spends from
    what the calling run has left (its usage counts with its ancestors': :func:`run_usage`).

    Raises:
        ValueError: the agent or its version was deleted, or its route has no entries.
    """
    version = AgentVersion.objects.filter(pk=run.agent_version_id).values_list("agent_id", flat=True).first()
    if version is None:
        raise ValueError("The agent version of this sub-run no longer exists.")
    claimed = ClaimedRun(
        pk=run.pk, tenant_id=run.tenant_id, session_id=run.session_id, user_id=run.user_id, agent_id=version,
        attempt=run.attempt, loop_count=run.loop_count, started_at=run.started_at or parent_started(parent),
        paused_seconds=run.paused_seconds, agent_version_id=run.agent_version_id,
    )
    try:
        own = _spec(claimed)
    except (AgentInstance.DoesNotExist, Tenant.DoesNotExist) as exc:
        raise ValueError("The agent of this sub-run no longer exists.") from exc
    import dataclasses

    return dataclasses.replace(
        own, max_tokens_per_run=parent.max_tokens_per_run, max_cost_per_run_usd_micros=parent.max_cost_per_run_usd_micros,
        tenant_monthly_budget_usd_micros=parent.tenant_monthly_budget_usd_micros, run_started_at=parent.run_started_at,
        run_paused_seconds=parent.run_paused_seconds, run_timeout_seconds=parent.run_timeout_seconds, steer=False,
        depth=run.depth, parent_run_id=parent.run_id, user_run_id=parent.waiting_run_id,
    )


def parent_started(parent: RunSpec) -> Any:
    """The parent's start as a datetime (a sub-run row always has its own; a fallback)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(parent.run_started_at, tz=UTC)
