"""The runner's database work, of two kinds:

- **per-turn statements** (``async def``: the history read, message, LLM call and tool call
  writes, heartbeats, usage, and the end of a run that nothing was steered into and that has
  no sub-runs): plain SQL on the run's event loop, through its async psycopg pool
  (:mod:`sessions.runner.pg`); awaited directly.
- **the rest** (plain ``def``: a run's claim and configuration, other runs' end, approvals,
  compactions, sub-runs, steering): ORM code, called through :func:`db`, which runs it on one
  of a few threads beside the loop. Each is self-contained (its own transaction), so they
  may run on any of those threads.

A run cancelled while it awaits a per-turn statement cancels the statement (psycopg asks the
server to) and nothing of it stays (each is one statement or one transaction): a turn is
written whole or not at all, and the run's end (``run_finish*``, never cancelled) records
calls left without a result as cancelled. A call on a thread finishes even if its caller
stopped waiting.

Every function here expects the caller to have set the tenant scope (the runner does, from
the run row it claimed), and filters by it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import close_old_connections, connection, transaction
from django.db.models import Exists, F, OuterRef, Sum
from django.utils import timezone

from agents.models import AgentInstance, CapabilityBinding
from capabilities.registry import binding_specs
from llm.models import ModelProvider, ModelRouteEntry
from llm.records import AttemptRecord
from llm.sanitize import clean_json, clean_json_text, clean_text
from llm.selectors import route_entries, route_entry_config
from llm.types import ChatMessage, ToolCallRequest
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalStatus,
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
from sessions.runner.pg import pg_connection, pipelined_transaction
from sessions.runner.spec import RunSpec
from tenants.models import Tenant
from tenants.scoping import require_tenant_id, system_scope

T = TypeVar("T")


_executor: ThreadPoolExecutor | None = None
_executor_threads = 0
_executor_lock = threading.Lock()


def db_executor() -> ThreadPoolExecutor:
    """This process's threads for the runner's database calls: ``RUN_HOST_DB_THREADS`` of
    them, named ``run-db_<n>`` (a new pool if the setting changed; the old one finishes its
    calls and ends).

    Not the event loop's default executor: that one also resolves host names
    (``loop.getaddrinfo``), which must not queue behind database calls, and its size
    (CPython: CPUs + 4) let ORM threads take the GIL from the loop that reads model streams.
    """
    global _executor, _executor_threads
    from django.conf import settings

    with _executor_lock:
        if _executor is None or _executor_threads != settings.RUN_HOST_DB_THREADS:
            if _executor is not None:
                _executor.shutdown(wait=False)
            _executor_threads = settings.RUN_HOST_DB_THREADS
            _executor = ThreadPoolExecutor(max_workers=_executor_threads, thread_name_prefix="run-db")
        return _executor


def db_executor_shutdown() -> None:
    """End :func:`db_executor`'s threads once their calls are done (the run host's shutdown)."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=True)


def db(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` as a coroutine function run on one of :func:`db_executor`'s threads, with a
    pooled connection (returned to the pool after the call, as Channels'
    ``database_sync_to_async`` does: ``close_old_connections()`` before and after).

    Not thread-sensitive: the runs a worker hosts would otherwise queue behind one thread
    for every ORM call. The caller's context (the tenant ContextVar) is copied into the
    thread. A cancelled caller stops waiting; a call already running finishes.

    Plain ``loop.run_in_executor`` rather than asgiref's ``SyncToAsync``, whose machinery
    (thread-sensitive contexts, deadlock detection, a new wrapper object per call) the
    runner does not need: measured 30–60 µs less event-loop CPU per call.
    """

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> T:
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            db_executor(), context.run, _on_db_thread, fn, args, kwargs
        )

    return call


def _on_db_thread(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


class RunNotClaimable(Exception):
    """The run is finished, unknown, or must wait for an earlier run of its session."""


async def run_tenant_id(run_id: int) -> int | None:
    """The tenant of the run (None: no such run)."""
    # tenant-bypass: the run row decides the tenant the rest of the run is scoped to.
    with system_scope():
        async with pg_connection() as conn:
            cursor = await conn.execute(f'SELECT "tenant_id" FROM "{_RUN}" WHERE "id" = %s', [run_id])
            row = await cursor.fetchone()
    return row[0] if row else None


def run_claim(run_id: int) -> RunSpec:
    """Mark the run running (attempt + 1, heartbeat now) and load everything it needs.

    A ``running`` run whose heartbeat is stale (older than ``RUN_STALE_SECONDS``) is claimed
    again: its worker died (a redelivery or the sweeper), and the run resumes from what it
    persisted. A ``running`` run with a fresh heartbeat belongs to a live worker and is
    refused, so a duplicate delivery never runs a run twice at once.

    A ``queued`` run starts only while its tenant has fewer runs working than its limit
    (``Tenant.max_concurrent_runs``, else ``RUNS_PER_TENANT_DEFAULT``); otherwise it stays
    queued and :func:`run_finish` of one of the tenant's runs hands it to a worker later.

    The claim is one short transaction (the tenant's row lock is held for a count and an
    update, so many runs of one tenant can start at once); the agent's configuration is
    read after it commits.

    Raises:
        RunNotClaimable: finished, missing, awaiting approval, held by a live worker, an
            earlier run of the session is active, or the tenant is at its limit.
        ValueError: the agent's configuration is unusable (no route entries…); the run is
            claimed by then, and the caller ends it failed.
    """
    return _spec(_run_claim_row(run_id))


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """The columns of a just-claimed run that :func:`_spec` needs."""

    pk: int
    tenant_id: int
    session_id: int
    user_id: int
    agent_id: int
    attempt: int
    loop_count: int
    started_at: Any
    paused_seconds: float

    @classmethod
    def of(cls, run: Run) -> ClaimedRun:
        """The same columns from a Run row (its session's agent included)."""
        return cls(
            pk=run.pk, tenant_id=run.tenant_id, session_id=run.session_id, user_id=run.user_id,
            agent_id=run.session.agent_id, attempt=run.attempt, loop_count=run.loop_count,
            started_at=run.started_at, paused_seconds=run.paused_seconds,
        )


_RUN, _SESSION, _TENANT = Run._meta.db_table, ChatSession._meta.db_table, Tenant._meta.db_table
_M, _TC, _LC = Message._meta.db_table, ToolCall._meta.db_table, LLMCall._meta.db_table


def _columns_sql(columns: tuple[str, ...]) -> str:
    """``"a", "b", …``: a column list for the hand-written INSERTs."""
    return ", ".join(f'"{c}"' for c in columns)


def _take_position_cte(only_if: str = "") -> str:
    """The CTE ``taken(position)`` every hand-written message INSERT starts with: the session's
    next message position, taken with an ``UPDATE … RETURNING`` (row-locked until the
    statement's transaction ends); ``only_if``: an extra SQL condition for taking it at all."""
    return (
        f'taken AS (UPDATE "{_SESSION}" SET "next_position" = "next_position" + 1, "updated_at" = %(now)s '
        f'WHERE "id" = %(session_id)s AND "tenant_id" = %(tenant_id)s{" AND " + only_if if only_if else ""} '
        'RETURNING "next_position" - 1 AS position)'
    )


_CLAIM_SESSION_OF_RUN_SQL = f'SELECT "session_id" FROM "{_RUN}" WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
_CLAIM_LOCK_SESSION_SQL = (
    f'SELECT "agent_id" FROM "{_SESSION}" WHERE "id" = %(session_id)s AND "tenant_id" = %(tenant_id)s FOR NO KEY UPDATE'
)
_CLAIM_LOCK_RUN_SQL = (
    'SELECT "status", "heartbeat_at", "steered_into_id", "user_id", "loop_count", "paused_seconds" '
    f'FROM "{_RUN}" WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s FOR NO KEY UPDATE'
)
_CLAIM_EARLIER_ACTIVE_SQL = (
    f'SELECT EXISTS (SELECT 1 FROM "{_RUN}" WHERE "session_id" = %(session_id)s AND "tenant_id" = %(tenant_id)s '
    'AND "id" < %(run_id)s AND "status" = ANY(%(active)s))'
)
_CLAIM_LOCK_TENANT_SQL = (
    f'SELECT "slug", "max_concurrent_runs" FROM "{_TENANT}" WHERE "id" = %(tenant_id)s FOR NO KEY UPDATE'
)
"""``FOR NO KEY UPDATE``, not ``FOR UPDATE``: claims of a tenant exclude each other all the
same, but every INSERT of a tenant-owned row takes ``FOR KEY SHARE`` on this row (its
foreign-key check, at the commit: Django's foreign keys are deferred), which ``FOR UPDATE``
would wait for and block. With 200 runs at once, each claim waited for the commits of the
tenant's other runs and held them up meanwhile (pg_stat_statements, bench/README.md). PostgreSQL, "Row-Level Locks": ``FOR UPDATE``
is only needed to delete the row or change its key."""
_CLAIM_WORKING_SQL = (
    f'SELECT COUNT(*) FROM "{_RUN}" WHERE "tenant_id" = %(tenant_id)s AND "status" = %(running)s '
    'AND "heartbeat_at" > %(stale_before)s'
)
_CLAIM_UPDATE_SQL = (
    f'UPDATE "{_RUN}" SET "status" = %(running)s, "attempt" = "attempt" + 1, '
    '"started_at" = COALESCE("started_at", %(now)s), "heartbeat_at" = %(now)s '
    'WHERE "id" = %(run_id)s RETURNING "attempt", "started_at"'
)


@transaction.atomic
def _run_claim_row(run_id: int) -> ClaimedRun:
    """The claim's transaction (see :func:`run_claim`): lock the session, then the run; check
    it may start; last, for a queued run, lock the tenant and count its working runs; mark it
    running. Plain SQL: the ORM's version was most of a claim's CPU (bench/README.md)."""
    params: dict[str, Any] = {"run_id": run_id, "tenant_id": require_tenant_id()}
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SESSION_OF_RUN_SQL, params)
        row = cursor.fetchone()
        if row is None:
            raise RunNotClaimable(f"run {run_id} not found")
        params["session_id"] = row[0]
        cursor.execute(_CLAIM_LOCK_SESSION_SQL, params)  # serialises runs of a session
        (agent_id,) = cursor.fetchone()
        cursor.execute(_CLAIM_LOCK_RUN_SQL, params)  # a concurrent cancel wins
        status, heartbeat_at, steered_into_id, user_id, loop_count, paused_seconds = cursor.fetchone()
        if status not in (RunStatus.QUEUED, RunStatus.RUNNING):
            raise RunNotClaimable(f"run {run_id} is {status}")
        if status == RunStatus.RUNNING and heartbeat_at is not None and heartbeat_at > stale_before():
            raise RunNotClaimable(f"run {run_id} is held by a live worker (heartbeat {heartbeat_at.isoformat()})")
        if steered_into_id is not None:
            raise RunNotClaimable(f"run {run_id} was handed to run {steered_into_id}")
        cursor.execute(_CLAIM_EARLIER_ACTIVE_SQL, {**params, "active": [str(s) for s in ACTIVE_RUN_STATUSES]})
        if cursor.fetchone()[0]:
            raise RunNotClaimable(f"run {run_id} waits for an earlier run of its session")
        params.update(running=RunStatus.RUNNING.value, now=timezone.now())
        if status == RunStatus.QUEUED:
            # Last before the commit: the tenant's claims queue on this lock, so hold it briefly.
            cursor.execute(_CLAIM_LOCK_TENANT_SQL, params)
            slug, max_concurrent_runs = cursor.fetchone()
            limit = tenant_run_limit(max_concurrent_runs)
            cursor.execute(_CLAIM_WORKING_SQL, {**params, "stale_before": stale_before()})
            working = cursor.fetchone()[0]
            if working >= limit:
                raise RunNotClaimable(f"run {run_id} waits: tenant {slug} has {working} of {limit} runs working")
        cursor.execute(_CLAIM_UPDATE_SQL, params)
        attempt, started_at = cursor.fetchone()
    return ClaimedRun(
        pk=run_id, tenant_id=params["tenant_id"], session_id=params["session_id"], user_id=user_id,
        agent_id=agent_id, attempt=attempt, loop_count=loop_count, started_at=started_at,
        paused_seconds=paused_seconds,
    )


def stale_before() -> Any:
    """Heartbeats older than this are a dead worker's (now − ``RUN_STALE_SECONDS``)."""
    from datetime import timedelta

    from django.conf import settings

    return timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS)


def tenant_run_limit(max_concurrent_runs: int | None) -> int:
    """A tenant's limit on working runs: its own (``Tenant.max_concurrent_runs``), else
    ``RUNS_PER_TENANT_DEFAULT``."""
    from django.conf import settings

    return max_concurrent_runs if max_concurrent_runs is not None else settings.RUNS_PER_TENANT_DEFAULT


async def run_heartbeat(run_id: int, attempt: int) -> bool:
    """Write the run's heartbeat for the worker holding ``attempt``.

    Returns:
        False if the run is no longer ``running`` under this attempt (it ended, paused, or
        another worker took it over after this one's heartbeat went stale).
    """
    async with pg_connection() as conn:
        cursor = await conn.execute(
            f'UPDATE "{_RUN}" SET "heartbeat_at" = %s '
            'WHERE "id" = %s AND "tenant_id" = %s AND "status" = %s AND "attempt" = %s',
            [timezone.now(), run_id, require_tenant_id(), RunStatus.RUNNING.value, attempt],
        )
        return cursor.rowcount == 1


def _select_all_sql(model: type) -> str:
    """``SELECT "a", "b", … FROM "table"`` with the model's own columns, never ``*``: these
    statements are prepared on long-lived connections (``DB_SERVER_SIDE_BINDING``), and
    PostgreSQL refuses to run a prepared ``SELECT *`` whose result columns changed ("cached
    plan must not change result type"), as they do when a migration adds a column while
    workers of the previous release still run."""
    return f'SELECT {_columns_sql(tuple(f.column for f in model._meta.concrete_fields))} FROM "{model._meta.db_table}"'


_SPEC_ROUTE_SQL = f'SELECT "route_id" FROM "{AgentInstance._meta.db_table}" WHERE "id" = %s AND "tenant_id" = %s'
_SPEC_ENTRY_PROVIDERS_SQL = (
    f'SELECT "provider_id" FROM "{ModelRouteEntry._meta.db_table}" WHERE "route_id" = ({_SPEC_ROUTE_SQL}) AND "tenant_id" = %s'
)
_SPEC_SQL = (
    (AgentInstance, f'{_select_all_sql(AgentInstance)} WHERE "id" = %s AND "tenant_id" = %s'),
    (Tenant, f'{_select_all_sql(Tenant)} WHERE "id" = %s'),
    (ModelRouteEntry, (
        f'{_select_all_sql(ModelRouteEntry)} WHERE "route_id" = ({_SPEC_ROUTE_SQL}) AND "tenant_id" = %s '
        'ORDER BY "position", "id"'
    )),
    (ModelProvider, f'{_select_all_sql(ModelProvider)} WHERE "id" IN ({_SPEC_ENTRY_PROVIDERS_SQL}) AND "tenant_id" = %s'),
    (CapabilityBinding, (
        f'{_select_all_sql(CapabilityBinding)} WHERE "agent_id" = %s AND "tenant_id" = %s AND "enabled" ORDER BY "id"'
    )),
)
"""The five reads of :func:`_spec_rows`, each with the model its rows are; none needs another's
result (the route and the providers are found by subqueries), so all go in one round trip."""


def _spec_params(run: ClaimedRun) -> tuple[list[int], ...]:
    agent, tenant = run.agent_id, run.tenant_id
    return [agent, tenant], [tenant], [agent, tenant, tenant], [agent, tenant, tenant, tenant], [agent, tenant]


_converters: dict[tuple[str, type], list[tuple[int, Any, list[Callable[..., Any]]]]] = {}


def _instances(model: type, rows: list[tuple[Any, ...]]) -> list[Any]:
    """Rows of ``_select_all_sql(model)`` as model instances, made as Django's querysets make
    them: each column through the backend's and its field's converters (JSON text to
    objects and the like), then ``Model.from_db``. The converters are looked up once per
    model and database."""
    fields = model._meta.concrete_fields
    key = (connection.alias, model)
    converters = _converters.get(key)
    if converters is None:
        converters = []
        for i, field in enumerate(fields):
            column = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found:
                converters.append((i, column, found))
        _converters[key] = converters
    names = [f.attname for f in fields]
    instances = []
    for row in rows:
        if converters:
            row = list(row)
            for i, column, functions in converters:
                value = row[i]
                for convert in functions:
                    value = convert(value, column, connection)
                row[i] = value
        instances.append(model.from_db(connection.alias, names, row))
    return instances


def _spec_rows(run: ClaimedRun) -> tuple[AgentInstance, Tenant, list[ModelRouteEntry], list[CapabilityBinding]]:
    """The agent, tenant, route entries (providers attached, in route order) and enabled
    bindings (by id) a run's configuration is built from.

    Five hand-written statements, each filtered by the run's tenant, sent in one psycopg
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
            results = [_instances(model, cursor.fetchall()) for (model, _sql), cursor in zip(_SPEC_SQL, cursors, strict=False)]
    agents, tenants, entries, providers_found, bindings = results
    if not agents:
        raise AgentInstance.DoesNotExist(f"agent {run.agent_id} of tenant {run.tenant_id}")
    if not tenants:
        raise Tenant.DoesNotExist(f"tenant {run.tenant_id}")
    providers = {p.pk: p for p in providers_found}
    for entry in entries:
        if entry.provider_id not in providers:
            raise ValueError(f"the provider of route entry {entry.pk} is not in the run's tenant")
        entry.provider = providers[entry.provider_id]
    return agents[0], tenants[0], entries, bindings


def _spec(run: ClaimedRun) -> RunSpec:
    """The RunSpec of a just-claimed run: its agent, limits, route entries and the specs of its
    enabled bindings, each loaded by its capability kind (:func:`capabilities.registry.binding_specs`)."""
    agent, tenant, entries, bindings = _spec_rows(run)
    if not entries:
        raise ValueError(f"the route {agent.route.name!r} of agent {agent.name!r} has no entries")
    configs = tuple(route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries))
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
    )


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
            cursor = await conn.execute(_RUN_SESSION_SQL, {"run_id": run_id, "tenant_id": tenant_id})
            found = await cursor.fetchone()
            if found is None:
                raise Run.DoesNotExist(f"run {run_id} not found")
            session_id, subrun = found[0], found[1] is not None
        if subrun:  # a sub-run: its own messages only, never compacted
            compaction = None
            sql, params = _HISTORY_SUBRUN_SQL, {"tenant_id": tenant_id, "run_id": run_id}
        else:  # a user's run: sub-runs' messages are not part of the session's conversation
            if compaction is _LOAD:
                compaction = await latest_compaction(conn, session_id)
            params = {"tenant_id": tenant_id, "session_id": session_id, "run_id": run_id}
            if compaction is None or compaction.effective_run is None:
                sql = _HISTORY_SQL.format(after_cursor="")
            else:
                sql = _HISTORY_SQL.format(after_cursor=_HISTORY_AFTER_CURSOR)
                params.update(cursor_run=compaction.effective_run, cursor_position=compaction.position)
        cursor = await conn.execute(sql, params)
        rows = [
            HistoryRow(pk, run, position, role, content, json.loads(tool_calls), tool_call_id, name, effective_run)
            for pk, run, position, role, content, tool_calls, tool_call_id, name, effective_run in await cursor.fetchall()
        ]
    answered = {m.tool_call_id for m in rows if m.role == MessageRole.TOOL}
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
    out = _results_in_call_order(out)
    # This run's last assistant message, when only its own tool results follow it: a resumed run
    # continues from it, with its answer, or with its calls that have no result yet (a worker
    # died mid-turn next to finished calls; an approved call next to an allowed one). Tool
    # results only move among themselves in _results_in_call_order, so ``kept`` still lines up.
    tail = None
    last = len(out) - 1
    while last >= 0 and out[last].role == "tool":
        last -= 1
    if last >= 0 and out[last].role == "assistant" and _effective_run(kept[last]) == run_id:
        if last == len(out) - 1 or any(c.id not in answered for c in out[last].tool_calls):
            tail = out[last]
    return History(messages=out, tail=tail, summary=compaction.summary if compaction else "", rows=kept,
                   compaction=compaction)


@transaction.atomic
def compaction_save(
    *, spec: RunSpec, attempt: int, status: str, summary: str = "", cursor_message_id: int | None = None,
    messages_summarized: int = 0, tokens_before: int = 0, tokens_after: int = 0, error: str = "",
) -> int:
    """Record a compaction attempt; a succeeded one moves the session's cursor. Returns its id."""
    row = Compaction.objects.create(
        tenant_id=spec.tenant_id, session_id=spec.session_id, run_id=spec.run_id, attempt=attempt, status=status,
        summary=clean_text(summary), cursor_message_id=cursor_message_id, messages_summarized=messages_summarized,
        tokens_before=tokens_before, tokens_after=tokens_after, error=clean_text(error[:5000]),
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


_MESSAGE_COLUMNS = ("tenant_id", "session_id", "run_id", "position", "role", "content", "reasoning", "tool_calls",
                    "tool_call_id", "name", "created_at")
"""Every column of a Message row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""

_MESSAGE_INSERT_SQL = f"""
WITH {_take_position_cte()}
INSERT INTO "{_M}" ({_columns_sql(_MESSAGE_COLUMNS)})
SELECT %(tenant_id)s, %(session_id)s, %(run_id)s, taken.position, %(role)s, %(content)s, %(reasoning)s,
       %(tool_calls)s::jsonb, %(tool_call_id)s, %(name)s, %(now)s
FROM taken
RETURNING "id"
"""


def _message_params(
    *, session_id: int, run_id: int, role: str, content: str, reasoning: str = "",
    tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str = "", name: str = "",
) -> dict[str, Any]:
    return {
        "now": timezone.now(), "session_id": session_id, "tenant_id": require_tenant_id(),
        "run_id": run_id, "role": role, "content": clean_text(content), "reasoning": clean_text(reasoning),
        "tool_calls": json.dumps(clean_json(tool_calls or [])), "tool_call_id": clean_text(tool_call_id),
        "name": clean_text(name),
    }


def _message_insert(**fields: Any) -> int:
    """Insert one message of run ``run_id`` at the session's next position (row-locked until
    the transaction ends); returns its id. Keyword arguments: ``session_id``, ``run_id``,
    ``role``, ``content``, and optionally ``reasoning``, ``tool_calls`` (``[{id, name,
    arguments}]``), ``tool_call_id``, ``name``.

    One statement: the position's ``UPDATE … RETURNING`` and the ``INSERT`` in one CTE (the
    runner writes a message at every turn and every tool result; the ORM's model
    construction, query compilation and a second round trip were most of that write's CPU).
    The runner's own messages are written by :data:`_TURN_SAVE_SQL` and
    :data:`_TOOL_CALL_FINISH_SQL`, which take the position the same way.

    Raises:
        ChatSession.DoesNotExist: no such session in the current tenant.
    """
    params = _message_params(**fields)
    with connection.cursor() as cursor:
        cursor.execute(_MESSAGE_INSERT_SQL, params)
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"session {params['session_id']} not found")
    return row[0]


_TOOL_CALL_COLUMNS = ("tenant_id", "run_id", "turn", "call_id", "name", "arguments", "arguments_raw", "status",
                      "result", "result_data", "error", "started_at", "finished_at", "duration_ms", "created_at")
"""Every column of a ToolCall row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""

_LLM_CALL_COLUMNS = ("tenant_id", "run_id", "turn", "attempt", "route_entry_id", "entry_index", "provider_name", "model",
                     "status", "error_class", "error", "latency_ms", "first_token_ms", "prompt_tokens",
                     "completion_tokens", "usage_estimated", "cost_usd_micros", "retry_wait_ms", "created_at")
"""Every column of an LLMCall row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""

_LLM_CALL_INSERT_SQL = (
    f'INSERT INTO "{_LC}" ({_columns_sql(_LLM_CALL_COLUMNS)}) VALUES ({", ".join(f"%({c})s" for c in _LLM_CALL_COLUMNS)})'
)


_RUN_ADD_USAGE_SQL = (
    f'UPDATE "{_RUN}" SET "loop_count" = COALESCE(%(loop_count)s, "loop_count"), '
    '"prompt_tokens" = "prompt_tokens" + %(prompt_tokens)s, '
    '"completion_tokens" = "completion_tokens" + %(completion_tokens)s, '
    '"cost_usd_micros" = "cost_usd_micros" + %(cost_usd_micros)s '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
)


_TURN_SAVE_SQL = f"""
WITH {_take_position_cte()}, message AS (
    INSERT INTO "{_M}" ({_columns_sql(_MESSAGE_COLUMNS)})
    SELECT %(tenant_id)s, %(session_id)s, %(run_id)s, taken.position, %(role)s, %(content)s, %(reasoning)s,
           %(tool_calls)s::jsonb, '', '', %(now)s
    FROM taken
    RETURNING "id"
), usage AS (
    {_RUN_ADD_USAGE_SQL} AND EXISTS (SELECT 1 FROM message)
), calls AS (
    INSERT INTO "{_TC}" ({_columns_sql(_TOOL_CALL_COLUMNS)})
    SELECT %(tenant_id)s, %(run_id)s, %(turn)s, c.call_id, c.name, c.arguments::jsonb, c.arguments_raw, %(pending)s,
           '', NULL, '', NULL, NULL, NULL, %(now)s
    FROM message, unnest(%(call_ids)s::text[], %(names)s::text[], %(arguments)s::text[], %(arguments_raw)s::text[])
         AS c(call_id, name, arguments, arguments_raw)
    RETURNING "id", "call_id"
){{llm_call}}
SELECT message."id", calls."id", calls."call_id" FROM message LEFT JOIN calls ON TRUE
"""
"""A model turn's writes in one statement (so one round trip, and atomic without a
transaction): the assistant message at the session's next position, the run's usage and
turn count, its tool calls, and (``{llm_call}``: :data:`_TURN_LLM_CALL_CTE` or nothing) the
answering LLM call. Every write after the message reads the ``message`` CTE, so none happens
when the session is not the current tenant's. One row per tool call (message id, call id,
model's call id), or one row with NULLs for none; no row: no such session."""

_NULLABLE_LLM_CALL_CASTS = {"route_entry_id": "::bigint", "first_token_ms": "::integer"}
_TURN_LLM_CALL_CTE = f""", llm_call AS (
    INSERT INTO "{_LC}" ({_columns_sql(_LLM_CALL_COLUMNS)})
    SELECT {", ".join(f"%({c})s{_NULLABLE_LLM_CALL_CASTS.get(c, '')}" for c in _LLM_CALL_COLUMNS)}
    FROM message
)"""
"""The LLMCall row of :data:`_TURN_SAVE_SQL` (parameters named as its columns; the nullable
ones cast, since a NULL parameter in a SELECT list has no type of its own)."""
_TURN_SAVE_WITH_LLM_CALL_SQL = _TURN_SAVE_SQL.format(llm_call=_TURN_LLM_CALL_CTE)
_TURN_SAVE_ONLY_SQL = _TURN_SAVE_SQL.format(llm_call="")


async def assistant_message_save(
    *, spec: RunSpec, turn: int, message: ChatMessage, reasoning: str = "", llm_call: AttemptRecord | None = None,
) -> list[dict[str, Any]]:
    """Persist an assistant message and its tool calls (``pending``; arguments that are not
    a JSON object are stored as ``{}`` beside the raw text); counts the turn. With
    ``llm_call`` (the attempt that produced the message), also its LLMCall row and usage.
    One statement (:data:`_TURN_SAVE_SQL`).

    Returns:
        ``[{pk, call_id, name, arguments_raw}]`` for the tool calls, in the model's order.

    Raises:
        ChatSession.DoesNotExist: no such session in the current tenant (nothing written).
    """
    parsed: list[str] = []
    for c in message.tool_calls:
        try:
            arguments: Any = c.parsed_arguments()
        except ValueError:
            arguments = {}
        parsed.append(json.dumps(clean_json(arguments)))
    params = _message_params(
        session_id=spec.session_id, run_id=spec.run_id, role=MessageRole.ASSISTANT, content=message.content,
        reasoning=reasoning,
        tool_calls=[{"id": c.id, "name": c.name, "arguments": clean_json_text(c.arguments)} for c in message.tool_calls],
    )
    params.update(
        turn=turn, loop_count=turn + 1, pending=ToolCallStatus.PENDING.value,
        prompt_tokens=llm_call.prompt_tokens if llm_call else 0,
        completion_tokens=llm_call.completion_tokens if llm_call else 0,
        cost_usd_micros=llm_call.cost_usd_micros if llm_call else 0,
        call_ids=[clean_text(c.id) for c in message.tool_calls], names=[clean_text(c.name) for c in message.tool_calls],
        arguments=parsed, arguments_raw=[clean_json_text(c.arguments) for c in message.tool_calls],
    )
    if llm_call is not None:
        params.update(_llm_call_params(spec=spec, turn=turn, record=llm_call))
    async with pg_connection() as conn:
        cursor = await conn.execute(_TURN_SAVE_WITH_LLM_CALL_SQL if llm_call is not None else _TURN_SAVE_ONLY_SQL, params)
        rows = await cursor.fetchall()
    if not rows:
        raise ChatSession.DoesNotExist(f"session {spec.session_id} not found")
    pks = {call_id: pk for _, pk, call_id in rows if pk is not None}  # call ids are unique per run
    return [{"pk": pks[clean_text(c.id)], "call_id": clean_text(c.id), "name": clean_text(c.name),
             "arguments_raw": clean_json_text(c.arguments)} for c in message.tool_calls]


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


_TOOL_CALL_START_SQL = (
    f'UPDATE "{_TC}" SET "status" = %(status)s, "started_at" = %(now)s '
    'WHERE "id" = %(pk)s AND "tenant_id" = %(tenant_id)s'
)


async def tool_call_start(*, pk: int) -> None:
    """Mark the call ``running`` (started now)."""
    async with pg_connection() as conn:
        await conn.execute(_TOOL_CALL_START_SQL, {
            "status": ToolCallStatus.RUNNING.value, "now": timezone.now(), "pk": pk, "tenant_id": require_tenant_id(),
        })


_TOOL_CALL_FINISH_SQL = f"""
WITH done AS (
    UPDATE "{_TC}" SET "status" = %(status)s, "result" = %(result)s, "result_data" = %(result_data)s::jsonb,
           "error" = %(error)s, "finished_at" = %(now)s, "duration_ms" = %(duration_ms)s
    WHERE "id" = %(pk)s AND "tenant_id" = %(tenant_id)s AND "finished_at" IS NULL
    RETURNING "call_id", "name"
), {_take_position_cte(only_if="EXISTS (SELECT 1 FROM done)")}
INSERT INTO "{_M}" ({_columns_sql(_MESSAGE_COLUMNS)})
SELECT %(tenant_id)s, %(session_id)s, %(run_id)s, taken.position, %(role)s, %(content)s, '', '[]'::jsonb,
       done."call_id", done."name", %(now)s
FROM done, taken
RETURNING "id"
"""
"""A tool call's outcome and its tool message in one statement: the call is updated only if
it has no result yet (the row lock decides between two attempts), and only then does the
message take the session's next position. One row: recorded; none: recorded before."""


async def tool_call_finish(
    *, spec: RunSpec, pk: int, status: str, content: str, data: Any, error: str, duration_ms: int,
    model_content: str | None = None,
) -> bool:
    """Record a tool call's outcome and its tool message (one statement,
    :data:`_TOOL_CALL_FINISH_SQL`). Idempotent: False if already recorded.

    ``content`` is the result as the tool returned it (ToolCall.result, shown in the UI);
    ``model_content``, when given, is what the model reads instead (the tool message), e.g.
    the result (or an outside tool's error) framed as untrusted data. Else a failed call's
    message is ``Error: <error>``.
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
        cursor = await conn.execute(_TOOL_CALL_FINISH_SQL, params)
        return await cursor.fetchone() is not None


def _jsonable(data: Any) -> Any:
    if data is None:
        return None
    try:
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return {"repr": repr(data)[:10_000]}


async def llm_call_record(*, spec: RunSpec, turn: int, record: AttemptRecord) -> None:
    """Write the LLMCall row and add its tokens and cost to the run's totals (one transaction)."""
    async with pg_connection() as conn, conn.transaction():
        await _run_add_usage(conn, spec=spec, record=record)
        await _llm_call_insert(conn, spec=spec, turn=turn, record=record)


def _llm_call_params(*, spec: RunSpec, turn: int, record: AttemptRecord) -> dict[str, Any]:
    """The LLMCall row of ``record``, by column (:data:`_LLM_CALL_COLUMNS`)."""
    entry_id = spec.entry_ids[record.entry_index] if record.entry_index < len(spec.entry_ids) else None
    return {
        "tenant_id": require_tenant_id(), "run_id": spec.run_id, "turn": turn, "attempt": record.attempt,
        "route_entry_id": entry_id, "entry_index": record.entry_index, "provider_name": record.provider_name,
        "model": record.model, "status": record.status, "error_class": record.error_class or "",
        "error": clean_text(record.error[:5000]), "latency_ms": max(0, record.latency_ms),
        "first_token_ms": record.first_token_ms, "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens, "usage_estimated": record.usage_estimated,
        "cost_usd_micros": record.cost_usd_micros, "retry_wait_ms": record.retry_wait_ms,
        "created_at": timezone.now(),
    }


async def _llm_call_insert(conn: Any, *, spec: RunSpec, turn: int, record: AttemptRecord) -> None:
    """One LLMCall row for ``record`` (a plain INSERT)."""
    await conn.execute(_LLM_CALL_INSERT_SQL, _llm_call_params(spec=spec, turn=turn, record=record))


async def _run_add_usage(
    conn: Any, *, spec: RunSpec, record: AttemptRecord | None, loop_count: int | None = None,
) -> None:
    """Add ``record``'s tokens and cost to the run's totals; with ``loop_count``, also set it
    (the turn is counted)."""
    await conn.execute(_RUN_ADD_USAGE_SQL, {
        "loop_count": loop_count, "run_id": spec.run_id, "tenant_id": require_tenant_id(),
        "prompt_tokens": record.prompt_tokens if record else 0,
        "completion_tokens": record.completion_tokens if record else 0,
        "cost_usd_micros": record.cost_usd_micros if record else 0,
    })


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


def tenant_month_cost_usd_micros(tenant_id: int) -> int:
    """Micro-USD of the tenant's LLM calls since the start of this calendar month (UTC)."""
    from sessions.selectors import month_start

    total = LLMCall.objects.filter(created_at__gte=month_start()).aggregate(total=Sum("cost_usd_micros"))["total"]
    return int(total or 0)


@dataclass(frozen=True, slots=True)
class RunFinished:
    """What :func:`run_finish` did that its caller acts on."""

    to_start: list[int]
    """Run ids to hand to workers now: the session's next queued run, and queued runs of the
    tenant that were waiting for a free slot (heads of their sessions, oldest first, at most
    the number of free slots)."""
    steered: list[int]
    """Runs whose messages were steered into this one, ended with it (their events are the caller's)."""


@transaction.atomic
def run_finish(
    *, run_id: int, status: str, reply: str = "", error: str = "", reason: str = "",
    may_have_steered: bool = True, may_have_subruns: bool = True,
) -> RunFinished:
    """Record the run's end (and of the runs steered into it, and of its sub-runs still active).

    ``may_have_steered`` / ``may_have_subruns`` False (the runner knows the agent is not in
    steer mode / has no skills, and this is the run's first attempt) skip those lookups.

    The run's row, then its session's, are locked (in that order) until the commit, so a claim
    of the session's next run sees this one ended. Plain SQL for the statements every run
    makes (the ORM's were most of this call's ~4 ms of CPU).

    Raises:
        Run.DoesNotExist: no such run in the current tenant.
    """
    params = _run_end_params(run_id=run_id, status=status, reply=reply, error=error, reason=reason)
    now, tenant_id = params["now"], params["tenant_id"]
    with connection.cursor() as cursor:
        cursor.execute(_RUN_END_SQL, params)
        params["session_id"], parent_tool_call_id = _run_ended(run_id, cursor.fetchone())
        cursor.execute(_SESSION_LOCK_SQL, params)
    steered: list[int] = []
    if may_have_steered:
        steered = list(Run.objects.filter(steered_into_id=run_id).order_by("pk").values_list("pk", flat=True))
        if steered:
            Run.objects.filter(pk__in=steered).update(
                status=status, reply=params["reply"], error=params["error"], reason=reason, finished_at=now,
            )
    with connection.cursor() as cursor:
        cursor.execute(_RUN_END_CALLS_SQL, params)
        cursor.execute(_RUN_END_APPROVALS_SQL, params)
        if may_have_subruns:
            subruns_end_with_parent(run_id=run_id, now=now)
        if parent_tool_call_id is not None:  # a sub-run starts nothing: its parent still holds the session
            return RunFinished(to_start=[], steered=steered)
        cursor.execute(_RUN_END_NEXT_SQL, params)
        next_id, tenant_has_queued = cursor.fetchone()
    out = [] if next_id is None else [next_id]
    if tenant_has_queued:
        out += [i for i in tenant_waiting_run_ids(tenant_id, known_queued=True) if i not in out]
    return RunFinished(to_start=out, steered=steered)


async def run_finish_alone(
    *, run_id: int, session_id: int, subrun: bool, status: str, reply: str = "", error: str = "", reason: str = "",
) -> RunFinished:
    """:func:`run_finish` for a run that nothing was steered into and that started no sub-run
    (the runner knows: the first attempt of a run of an agent not in steer mode and without
    skills), on the loop's async connection: the same statements in one transaction, sent
    together in one round trip (:func:`~sessions.runner.pg.pipelined_transaction`), no thread. ``session_id`` and
    ``subrun`` (whether it is a skill's sub-run) come from the run's spec, so that no
    statement waits for another's result. Only if the tenant has queued runs does it ask a
    thread which of them may start now.

    Raises:
        Run.DoesNotExist: no such run in the current tenant (nothing changed then).
    """
    params = _run_end_params(run_id=run_id, status=status, reply=reply, error=error, reason=reason)
    params["session_id"] = session_id
    async with pg_connection() as conn:
        async with pipelined_transaction(conn):
            ended = await conn.execute(_RUN_END_SQL, params)
            await conn.execute(_SESSION_LOCK_SQL, params)
            await conn.execute(_RUN_END_CALLS_SQL, params)
            await conn.execute(_RUN_END_APPROVALS_SQL, params)
            following = None if subrun else await conn.execute(_RUN_END_NEXT_SQL, params)
        # Committed, unless the run is not there: then every statement changed nothing.
        _run_ended(run_id, await ended.fetchone())
        if following is None:  # a sub-run starts nothing: its parent still holds the session
            return RunFinished(to_start=[], steered=[])
        next_id, tenant_has_queued = await following.fetchone()
    out = [] if next_id is None else [next_id]
    if tenant_has_queued:
        waiting = await db(tenant_waiting_run_ids)(params["tenant_id"], known_queued=True)
        out += [i for i in waiting if i not in out]
    return RunFinished(to_start=out, steered=[])


def _run_end_params(*, run_id: int, status: str, reply: str, error: str, reason: str) -> dict[str, Any]:
    """The parameters of every ``_RUN_END_*`` statement (``session_id`` is added once known)."""
    return {
        "run_id": run_id, "tenant_id": require_tenant_id(), "status": status, "reply": clean_text(reply),
        "error": clean_text(error[:5000]),
        "reason": reason, "now": timezone.now(), "session_id": None,
        "call_cancelled": ToolCallStatus.CANCELLED.value, "approval_expired": ApprovalStatus.EXPIRED.value,
        "approval_pending": ApprovalStatus.PENDING.value, "queued": RunStatus.QUEUED.value,
    }


def _run_ended(run_id: int, row: Any) -> tuple[int, int | None]:
    """(session id, parent tool call id) from ``_RUN_END_SQL``'s row."""
    if row is None:
        raise Run.DoesNotExist(f"run {run_id} not found")
    return row[0], row[1]


_RUN_END_SQL = (
    f'UPDATE "{_RUN}" SET "status" = %(status)s, "reply" = %(reply)s, "error" = %(error)s, '
    '"reason" = %(reason)s, "finished_at" = %(now)s, "heartbeat_at" = NULL '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s RETURNING "session_id", "parent_tool_call_id"'
)
_SESSION_LOCK_SQL = (
    f'SELECT 1 FROM "{_SESSION}" WHERE "id" = %(session_id)s AND "tenant_id" = %(tenant_id)s FOR NO KEY UPDATE'
)
_RUN_END_CALLS_SQL = (
    f'UPDATE "{_TC}" SET "status" = %(call_cancelled)s, "finished_at" = %(now)s '
    'WHERE "run_id" = %(run_id)s AND "tenant_id" = %(tenant_id)s AND "finished_at" IS NULL'
)
"""Calls left without a result (the run ended mid-turn) are recorded as cancelled."""
_RUN_END_APPROVALS_SQL = (
    f'UPDATE "{Approval._meta.db_table}" SET "status" = %(approval_expired)s '
    'WHERE ("run_id" = %(run_id)s OR "sub_run_id" = %(run_id)s) AND "tenant_id" = %(tenant_id)s '
    'AND "status" = %(approval_pending)s'
)
"""A run's pending approvals expire when it ends: a user's run's own (``run``), or a sub-run's
(``sub_run``; they belong to the user's run)."""
_RUN_END_NEXT_SQL = (
    f'SELECT (SELECT "id" FROM "{_RUN}" WHERE "session_id" = %(session_id)s '
    'AND "tenant_id" = %(tenant_id)s AND "status" = %(queued)s ORDER BY "id" LIMIT 1), '
    f'EXISTS (SELECT 1 FROM "{_RUN}" WHERE "tenant_id" = %(tenant_id)s AND "status" = %(queued)s '
    'AND "steered_into_id" IS NULL)'
)
"""The session's next queued run (as :func:`sessions.services.next_queued_run_id`), and whether
the tenant has any queued run at all (else :func:`tenant_waiting_run_ids` has nothing to find)."""


def tenant_waiting_run_ids(tenant_id: int, *, known_queued: bool = False) -> list[int]:
    """Queued runs of the tenant that could start now: first in their session, oldest first,
    at most as many as the tenant has free slots. ``known_queued``: the caller saw that the
    tenant has queued runs (skips that check)."""
    if not known_queued and not Run.objects.filter(status=RunStatus.QUEUED, steered_into__isnull=True).exists():
        return []  # the common case, in one query
    tenant = Tenant.objects.get(pk=tenant_id)
    working = Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__gt=stale_before()).count()
    free = tenant_run_limit(tenant.max_concurrent_runs) - working
    if free <= 0:
        return []
    earlier_active = Run.objects.filter(
        session_id=OuterRef("session_id"), pk__lt=OuterRef("pk"), status__in=ACTIVE_RUN_STATUSES
    )
    return list(
        Run.objects.filter(status=RunStatus.QUEUED, steered_into__isnull=True)
        .exclude(Exists(earlier_active)).order_by("pk").values_list("pk", flat=True)[:free]
    )


@dataclass(frozen=True, slots=True)
class ApprovalState:
    approval_id: int
    kind: str
    status: str
    answer: str


def approvals_for_calls(*, call_pks: list[int]) -> dict[int, ApprovalState]:
    """``{tool call pk: ApprovalState}`` for the calls that have an approval (any status).

    By call only: a sub-run's approvals belong to the user's run (``Approval.run``)."""
    return {
        a.tool_call_id: ApprovalState(approval_id=a.pk, kind=a.kind, status=a.status, answer=a.answer)
        for a in Approval.objects.filter(tool_call_id__in=call_pks)
    }


@transaction.atomic
def approval_request(
    *, spec: RunSpec, call_pk: int, kind: str, tool_name: str, arguments: Any, reason: str = "", question: str = "",
) -> int:
    """Record that tool call ``call_pk`` of run ``spec`` waits for a human (approval or
    answer). Idempotent.

    The Approval belongs to the user's run (``spec.waiting_run_id``: the run itself, or the
    top of a sub-run's tree), with ``sub_run`` set when the call is a sub-run's.

    Returns the Approval id. The call is marked ``awaiting_approval``.
    """
    from datetime import timedelta

    from django.conf import settings

    approval, _ = Approval.objects.get_or_create(
        tool_call_id=call_pk,
        defaults={
            "tenant_id": spec.tenant_id, "run_id": spec.waiting_run_id,
            "sub_run_id": spec.run_id if spec.depth > 0 else None, "kind": kind, "tool_name": tool_name,
            "arguments": clean_json(_jsonable(arguments)) or {}, "reason": clean_text(reason[:5000]),
            "question": clean_text(question),
            "expires_at": timezone.now() + timedelta(seconds=settings.APPROVAL_TTL_SECONDS),
        },
    )
    ToolCall.objects.filter(pk=call_pk).update(status=ToolCallStatus.AWAITING_APPROVAL)
    return approval.pk


@transaction.atomic
def run_pause(run_id: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The run waits for approvals: status ``awaiting_approval``, no worker holds it.

    If every approval was already decided meanwhile (a fast approver), the run is queued
    again instead and its id is returned to be handed to a worker.

    Returns:
        (the pending approvals as event payloads, run ids to hand to workers now: the run
        itself if nothing is pending, plus tenant runs waiting for the slot it frees).
    """
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    pending = list(
        Approval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).select_related("sub_run__skill")
        .order_by("id")
    )
    now = timezone.now()
    if not pending:
        run.status = RunStatus.QUEUED
        run.heartbeat_at = None
        run.save(update_fields=["status", "heartbeat_at"])
        return [], [run_id]
    run.status = RunStatus.AWAITING_APPROVAL
    run.paused_at = now
    run.heartbeat_at = None
    run.save(update_fields=["status", "paused_at", "heartbeat_at"])
    Run.objects.filter(steered_into_id=run_id).update(status=RunStatus.AWAITING_APPROVAL)
    return [approval_payload(a) for a in pending], tenant_waiting_run_ids(run.tenant_id)


def approval_payload(a: Approval) -> dict[str, Any]:
    """An approval as it appears in events: ``sub_run_id`` and ``skill`` (the skill's name) are
    set when the call is a skill's sub-run's, else None. Load with ``select_related("sub_run__skill")``."""
    return {
        "approval_id": a.pk, "tool_call_id": a.tool_call_id, "kind": a.kind, "status": a.status,
        "tool_name": a.tool_name, "arguments": a.arguments, "reason": a.reason, "question": a.question,
        "expires_at": a.expires_at.isoformat(), "sub_run_id": a.sub_run_id,
        "skill": a.skill_name,
    }


@transaction.atomic
def steer_absorb(run_id: int) -> list[int]:
    """Hand the session's queued steer messages to running run ``run_id``.

    Runs posted in steer mode after ``run_id`` that are still queued become part of it
    (``steered_into``; status running): their user messages move to the end of the history
    (new positions: they were written while this run's tool calls were still being answered,
    and a call/result pair must not be split) and they end as this run ends. Called only
    between model turns, when every tool call of the run has its result.

    Returns:
        The ids of the runs absorbed now.
    """
    run = Run.objects.get(pk=run_id)
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=run.session_id)
    ids = list(
        Run.objects.select_for_update(no_key=True)
        .filter(session_id=run.session_id, status=RunStatus.QUEUED, steer=True, pk__gt=run_id, steered_into__isnull=True)
        .order_by("pk").values_list("pk", flat=True)
    )
    if ids:
        Run.objects.filter(pk__in=ids).update(
            steered_into_id=run_id, status=RunStatus.RUNNING, started_at=timezone.now()
        )
        for message in Message.objects.filter(run_id__in=ids).order_by("position"):
            message.position = session.next_position
            session.next_position += 1
            message.save(update_fields=["position"])
        session.save(update_fields=["next_position", "updated_at"])
    return ids


async def session_has_artifacts(session_id: int) -> bool:
    """Whether any artifact belongs to the session (the runner then offers ``read_artifact``)."""
    from sessions.models import Artifact

    async with pg_connection() as conn:
        cursor = await conn.execute(
            f'SELECT EXISTS (SELECT 1 FROM "{Artifact._meta.db_table}" WHERE "session_id" = %s AND "tenant_id" = %s)',
            [session_id, require_tenant_id()],
        )
        return (await cursor.fetchone())[0]


# --- sub-runs (skills) -------------------------------------------------------------------------


def subruns_end_with_parent(*, run_id: int, now: Any) -> int:
    """End the still-active sub-runs below run ``run_id`` (any depth) as ``cancelled``.

    A sub-run lives inside its parent's tool call; when the parent ends first (cancelled,
    timed out, failed) nothing else would ever end it. Returns how many were ended.
    """
    ended = 0
    parents = [run_id]
    while parents:
        children = list(Run.objects.filter(parent_tool_call__run_id__in=parents).values_list("pk", "status"))
        active = [pk for pk, status in children if status in ACTIVE_RUN_STATUSES]
        if active:
            Run.objects.filter(pk__in=active).update(
                status=RunStatus.CANCELLED, error="Its parent run ended first.", finished_at=now, heartbeat_at=None,
            )
            ToolCall.objects.filter(run_id__in=active, finished_at__isnull=True).update(
                status=ToolCallStatus.CANCELLED, finished_at=now
            )
            Approval.objects.filter(sub_run_id__in=active, status=ApprovalStatus.PENDING).update(
                status=ApprovalStatus.EXPIRED
            )
            ended += len(active)
        parents = [pk for pk, _ in children]
    return ended


@dataclass(frozen=True, slots=True)
class SubRunState:
    run_id: int
    status: str
    reply: str
    error: str
    created: bool


@transaction.atomic
def subrun_open(*, parent: RunSpec, call_pk: int, skill_id: int, task: str) -> SubRunState:
    """The sub-run answering tool call ``call_pk`` of run ``parent``: created now (status
    ``running``, the task as its user message), or the existing one (a parent resumed after its
    worker died, or after a human answered an approval inside the sub-run, re-executes the
    call: the same sub-run resumes, attempt + 1).

    Sub-runs have no heartbeat of their own (the parent's covers them) and are never
    touched by the sweeper or the tenant's run limit.
    """
    existing = Run.objects.select_for_update(no_key=True).filter(parent_tool_call_id=call_pk).first()
    if existing is not None:
        if existing.status in ACTIVE_RUN_STATUSES:
            existing.status = RunStatus.RUNNING
            existing.attempt += 1
            existing.paused_at = None
            existing.save(update_fields=["status", "attempt", "paused_at"])
        return SubRunState(run_id=existing.pk, status=existing.status, reply=existing.reply, error=existing.error,
                           created=False)
    now = timezone.now()
    run = Run.objects.create(
        tenant_id=parent.tenant_id, session_id=parent.session_id, user_id=parent.user_id, input=task,
        status=RunStatus.RUNNING, attempt=1, started_at=now, parent_tool_call_id=call_pk, depth=parent.depth + 1,
        skill_id=skill_id,
    )
    _message_insert(session_id=parent.session_id, run_id=run.pk, role=MessageRole.USER, content=task)
    return SubRunState(run_id=run.pk, status=run.status, reply="", error="", created=True)


@transaction.atomic
def subrun_pause(*, run_id: int, attempt: int, call_pk: int) -> list[dict[str, Any]] | None:
    """Sub-run ``run_id`` waits for a human: status ``awaiting_approval``, and so does its
    parent's skill call ``call_pk``. The user's run pauses next (:func:`run_pause`), and when it
    resumes, the skill call is executed again and :func:`subrun_open` resumes this sub-run.

    Returns:
        The sub-run's own pending approvals as event payloads, or None if nothing was
        recorded (it ended meanwhile, or a later attempt holds it).
    """
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    if run.status not in ACTIVE_RUN_STATUSES or run.attempt != attempt:
        return None
    run.status = RunStatus.AWAITING_APPROVAL
    run.paused_at = timezone.now()
    run.save(update_fields=["status", "paused_at"])
    ToolCall.objects.filter(pk=call_pk, finished_at__isnull=True).update(status=ToolCallStatus.AWAITING_APPROVAL)
    pending = Approval.objects.filter(sub_run_id=run_id, status=ApprovalStatus.PENDING).select_related("sub_run__skill")
    return [approval_payload(a) for a in pending.order_by("id")]


def subrun_spec(*, subrun_id: int, parent: RunSpec) -> RunSpec:
    """The RunSpec of a sub-run: the skill's instructions, loop limit and route (else the
    parent's entries); the parent's timeouts, parallelism, budgets and run deadline.

    Raises:
        ValueError: the skill was deleted, or its route has no entries.
    """
    run = Run.objects.select_related("skill").get(pk=subrun_id)
    skill = run.skill
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
    )


@transaction.atomic
def subrun_finish(
    *, run_id: int, status: str, reply: str = "", error: str = "", reason: str = "", attempt: int | None = None,
) -> bool:
    """Record a sub-run's end and add its tokens and cost to its parent run (once).

    The parent's totals then include everything done on its behalf (the session's usage
    counts only user runs; LLMCall rows keep the per-call truth). ``attempt``: the attempt
    the caller holds; if the sub-run was resumed since (its parent was taken over by another
    worker), nothing is recorded.

    Returns:
        False if nothing was recorded (already ended, or a later attempt holds it).
    """
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    if run.status not in ACTIVE_RUN_STATUSES or (attempt is not None and run.attempt != attempt):
        return False
    run_finish(run_id=run_id, status=status, reply=reply, error=error, reason=reason)
    parent_run_id = ToolCall.objects.values_list("run_id", flat=True).get(pk=run.parent_tool_call_id)
    Run.objects.filter(pk=parent_run_id).update(
        prompt_tokens=F("prompt_tokens") + run.prompt_tokens,
        completion_tokens=F("completion_tokens") + run.completion_tokens,
        cost_usd_micros=F("cost_usd_micros") + run.cost_usd_micros,
    )
    return True
