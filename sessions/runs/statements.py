"""The run lifecycle's hand-written SQL: the statements every run makes (its claim, each
model turn's and tool call's rows, its end), kept as plain SQL because the ORM's versions were
most of their CPU (bench/README.md). Only :mod:`sessions.runs` uses them; each is pinned
against the models it writes by ``sessions/tests/test_runner_sql.py``.

Every statement filters by ``%(tenant_id)s`` (the caller's tenant scope) besides row-level
security.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils import timezone

from llm.sanitize import clean_json, clean_text
from sessions.llm_bodies import BODY_COLUMNS
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    USAGE_MONTH_SHARDS,
    Approval,
    ApprovalStatus,
    ChatSession,
    LLMCall,
    LLMCallBody,
    Message,
    Run,
    RunStatus,
    TaskPushConfig,
    ToolCall,
    ToolCallStatus,
    UsageMonth,
)
from tenants.models import Tenant
from tenants.scoping import require_tenant_id

RUN, SESSION, TENANT = Run._meta.db_table, ChatSession._meta.db_table, Tenant._meta.db_table
M, TC, LC = Message._meta.db_table, ToolCall._meta.db_table, LLMCall._meta.db_table
LCB = LLMCallBody._meta.db_table
UM = UsageMonth._meta.db_table
PUSH = TaskPushConfig._meta.db_table


def columns_sql(columns: tuple[str, ...]) -> str:
    """``"a", "b", …``: a column list for the hand-written INSERTs."""
    return ", ".join(f'"{c}"' for c in columns)


def take_position_cte(only_if: str = "") -> str:
    """The CTE ``taken(position)`` every hand-written message INSERT starts with: the session's
    next message position, taken with an ``UPDATE … RETURNING`` (row-locked until the
    statement's transaction ends); ``only_if``: an extra SQL condition for taking it at all."""
    return (
        f'taken AS (UPDATE "{SESSION}" SET "next_position" = "next_position" + 1, "updated_at" = %(now)s '
        f'WHERE "id" = %(session_id)s AND "tenant_id" = %(tenant_id)s{" AND " + only_if if only_if else ""} '
        'RETURNING "next_position" - 1 AS position)'
    )


CLAIM_SESSION_OF_RUN_SQL = f'SELECT "session_id" FROM "{RUN}" WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
CLAIM_LOCK_SESSION_SQL = (
    f'SELECT "agent_id" FROM "{SESSION}" WHERE "id" = %(session_id)s AND "tenant_id" = %(tenant_id)s FOR NO KEY UPDATE'
)
CLAIM_LOCK_RUN_SQL = (
    'SELECT "status", "heartbeat_at", "steered_into_id", "user_id", "loop_count", "paused_seconds", '
    '"request_options", "agent_version_id", "purpose" '
    f'FROM "{RUN}" WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s FOR NO KEY UPDATE'
)
CLAIM_EARLIER_ACTIVE_SQL = (
    f'SELECT EXISTS (SELECT 1 FROM "{RUN}" WHERE "session_id" = %(session_id)s AND "tenant_id" = %(tenant_id)s '
    'AND "id" < %(run_id)s AND "status" = ANY(%(active)s))'
)
CLAIM_LOCK_TENANT_SQL = (
    f'SELECT "slug", "max_concurrent_runs" FROM "{TENANT}" WHERE "id" = %(tenant_id)s FOR NO KEY UPDATE'
)
"""``FOR NO KEY UPDATE``, not ``FOR UPDATE``: claims of a tenant exclude each other all the
same, but every INSERT of a tenant-owned row takes ``FOR KEY SHARE`` on this row (its
foreign-key check, at the commit: Django's foreign keys are deferred), which ``FOR UPDATE``
would wait for and block. With 200 runs at once, each claim waited for the commits of the
tenant's other runs and held them up meanwhile (pg_stat_statements, bench/README.md). PostgreSQL, "Row-Level Locks": ``FOR UPDATE``
is only needed to delete the row or change its key."""
CLAIM_WORKING_SQL = (
    f'SELECT COUNT(*) FROM "{RUN}" WHERE "tenant_id" = %(tenant_id)s AND "status" = %(running)s '
    'AND "heartbeat_at" > %(stale_before)s'
)
CLAIM_UPDATE_SQL = (
    f'UPDATE "{RUN}" SET "status" = %(running)s, "attempt" = "attempt" + 1, '
    '"started_at" = COALESCE("started_at", %(now)s), "heartbeat_at" = %(now)s, "held_back" = false '
    'WHERE "id" = %(run_id)s RETURNING "attempt", "started_at"'
)
CLAIM_HOLD_SQL = f'UPDATE "{RUN}" SET "held_back" = true WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
"""A queued run's claim refused for its tenant's limit: committed with the refusal, under the
tenant's row lock, so that the run's end that frees a slot sees it (``Run.held_back``)."""
TENANT_HELD_HAND_SQL = (
    f'UPDATE "{RUN}" SET "held_back" = false WHERE "id" IN ('
    f'SELECT "r"."id" FROM "{RUN}" "r" WHERE "r"."tenant_id" = %(tenant_id)s AND "r"."status" = %(queued)s '
    'AND "r"."held_back" AND "r"."steered_into_id" IS NULL '
    f'AND NOT EXISTS (SELECT 1 FROM "{RUN}" "e" WHERE "e"."session_id" = "r"."session_id" '
    'AND "e"."tenant_id" = %(tenant_id)s AND "e"."id" < "r"."id" AND "e"."status" = ANY(%(active)s)) '
    'ORDER BY "r"."id" LIMIT GREATEST(%(limit)s - ('
    f'SELECT COUNT(*) FROM "{RUN}" "w" WHERE "w"."tenant_id" = %(tenant_id)s AND "w"."status" = %(running)s '
    'AND "w"."heartbeat_at" > %(stale_before)s), 0)'
    ') RETURNING "id"'
)
"""The tenant's held-back runs (``Run.held_back``) that may start now, first in their session,
oldest first, at most as many as the tenant has free slots: marked handed (not held) and
returned. Run under the tenant's row lock (:data:`CLAIM_LOCK_TENANT_SQL`)."""



MESSAGE_COLUMNS = ("tenant_id", "session_id", "run_id", "position", "role", "content", "reasoning", "tool_calls",
                    "tool_call_id", "name", "created_at")
"""Every column of a Message row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""

MESSAGE_INSERT_SQL = f"""
WITH {take_position_cte()}
INSERT INTO "{M}" ({columns_sql(MESSAGE_COLUMNS)})
SELECT %(tenant_id)s, %(session_id)s, %(run_id)s, taken.position, %(role)s, %(content)s, %(reasoning)s,
       %(tool_calls)s::jsonb, %(tool_call_id)s, %(name)s, %(now)s
FROM taken
RETURNING "id"
"""


def message_params(
    *, session_id: int, run_id: int, role: str, content: str, reasoning: str = "",
    tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str = "", name: str = "",
) -> dict[str, Any]:
    return {
        "now": timezone.now(), "session_id": session_id, "tenant_id": require_tenant_id(),
        "run_id": run_id, "role": role, "content": clean_text(content), "reasoning": clean_text(reasoning),
        "tool_calls": json.dumps(clean_json(tool_calls or [])), "tool_call_id": clean_text(tool_call_id),
        "name": clean_text(name),
    }



TOOL_CALL_COLUMNS = ("tenant_id", "run_id", "turn", "call_id", "name", "arguments", "arguments_raw", "status",
                      "result", "result_data", "error", "started_at", "finished_at", "duration_ms", "server_log",
                      "created_at")
"""Every column of a ToolCall row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""

LLM_CALL_COLUMNS = ("tenant_id", "run_id", "turn", "purpose", "agent_id", "user_id", "attempt", "route_entry_id",
                     "entry_index", "provider_name", "model", "status", "error_class", "error", "latency_ms",
                     "first_token_ms", "prompt_tokens", "completion_tokens", "usage_estimated", "cost_usd_micros",
                     "retry_wait_ms", "rolled_up", "created_at")
"""Every column of an LLMCall row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""

LLM_CALL_INSERT_SQL = (
    f'INSERT INTO "{LC}" ({columns_sql(LLM_CALL_COLUMNS)}) VALUES ({", ".join(f"%({c})s" for c in LLM_CALL_COLUMNS)})'
)

LLM_CALL_BODY_COLUMNS = ("tenant_id", "llm_call_id", *BODY_COLUMNS, "created_at")
"""Every column of an LLMCallBody row but ``id`` (sessions/tests/test_runner_sql.py pins this)."""


def llm_call_body_cte(calls: str) -> str:
    """``, llm_call_body AS (INSERT …)``: the model call record of the LLM call that the CTE
    ``calls`` wrote (its ``RETURNING`` has ``id``, ``tenant_id`` and ``created_at``), with the
    body columns as parameters named ``body_<column>`` (:func:`sessions.llm_bodies.body_columns`).
    Appended only for a tenant that records bodies: the other statements stay as they were."""
    values = ", ".join(f'%(body_{c})s' for c in BODY_COLUMNS)
    return f""", llm_call_body AS (
    INSERT INTO "{LCB}" ({columns_sql(LLM_CALL_BODY_COLUMNS)})
    SELECT {calls}."tenant_id", {calls}."id", {values}, {calls}."created_at" FROM {calls}
)"""


LLM_CALL_WITH_BODY_INSERT_SQL = (
    f'WITH llm_call AS ({LLM_CALL_INSERT_SQL} RETURNING "id", "tenant_id", "created_at"){llm_call_body_cte("llm_call")} '
    'SELECT 1'
)
""":data:`LLM_CALL_INSERT_SQL` and the call's model call record in one statement (a failed or
unanswered attempt of a tenant that records bodies)."""


RUN_ADD_USAGE_SQL = (
    f'UPDATE "{RUN}" SET "loop_count" = COALESCE(%(loop_count)s, "loop_count"), '
    '"prompt_tokens" = "prompt_tokens" + %(prompt_tokens)s, '
    '"completion_tokens" = "completion_tokens" + %(completion_tokens)s, '
    '"cost_usd_micros" = "cost_usd_micros" + %(cost_usd_micros)s '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s'
)


TURN_SAVE_SQL = f"""
WITH {take_position_cte()}, message AS (
    INSERT INTO "{M}" ({columns_sql(MESSAGE_COLUMNS)})
    SELECT %(tenant_id)s, %(session_id)s, %(run_id)s, taken.position, %(role)s, %(content)s, %(reasoning)s,
           %(tool_calls)s::jsonb, '', '', %(now)s
    FROM taken
    RETURNING "id"
), usage AS (
    {RUN_ADD_USAGE_SQL} AND EXISTS (SELECT 1 FROM message) RETURNING "id"
), calls AS (
    INSERT INTO "{TC}" ({columns_sql(TOOL_CALL_COLUMNS)})
    SELECT %(tenant_id)s, %(run_id)s, %(turn)s, c.call_id, c.name, c.arguments::jsonb, c.arguments_raw, %(pending)s,
           '', NULL, '', NULL, NULL, NULL, '[]'::jsonb, %(now)s
    FROM message, unnest(%(call_ids)s::text[], %(names)s::text[], %(arguments)s::text[], %(arguments_raw)s::text[])
         AS c(call_id, name, arguments, arguments_raw)
    RETURNING "id", "call_id"
){{llm_call}}
SELECT message."id", calls."id", calls."call_id" FROM message LEFT JOIN calls ON TRUE
"""
"""A model turn's writes in one statement (so one round trip, and atomic without a
transaction): the assistant message at the session's next position, the run's usage and
turn count, its tool calls, and (``{llm_call}``: :data:`TURN_LLM_CALL_CTE` or nothing) the
answering LLM call and its count in the month's usage rollup. Every write after the message reads the ``message`` CTE, so none happens
when the session is not the current tenant's. One row per tool call (message id, call id,
model's call id), or one row with NULLs for none; no row: no such session."""

NULLABLE_LLM_CALL_CASTS = {"route_entry_id": "::bigint", "first_token_ms": "::integer", "agent_id": "::bigint",
                           "user_id": "::bigint"}


def rollup_add_sql(calls: str) -> str:
    """An ``INSERT … ON CONFLICT DO UPDATE`` adding the rows of ``calls`` (a table or CTE with
    an LLM call's ``tenant_id``, ``created_at``, ``prompt_tokens``, ``completion_tokens`` and
    ``cost_usd_micros``) to the monthly usage rollup: summed per tenant and month (UTC), in
    that order, into the transaction's shard ``txid_current() % USAGE_MONTH_SHARDS``, as the
    rollup's trigger adds any other call (sessions/migrations/0013_usage_month_runner_counts.py).
    The calls must be written ``rolled_up`` (``TRUE``), or the trigger counts them a second time.
    For a statement sent with parameters (its ``%`` is written ``%%``)."""
    return f"""INSERT INTO "{UM}" AS u ("tenant_id", "month", "shard", "llm_calls", "prompt_tokens", "completion_tokens",
                                     "cost_usd_micros")
    SELECT c."tenant_id", (date_trunc('month', c."created_at" AT TIME ZONE 'UTC'))::date,
           (txid_current() %% {USAGE_MONTH_SHARDS})::smallint, count(*), sum(c."prompt_tokens"),
           sum(c."completion_tokens"), sum(c."cost_usd_micros")
    FROM {calls} AS c GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT ("tenant_id", "month", "shard") DO UPDATE SET "llm_calls" = u."llm_calls" + EXCLUDED."llm_calls",
        "prompt_tokens" = u."prompt_tokens" + EXCLUDED."prompt_tokens",
        "completion_tokens" = u."completion_tokens" + EXCLUDED."completion_tokens",
        "cost_usd_micros" = u."cost_usd_micros" + EXCLUDED."cost_usd_micros\""""


TURN_LLM_CALL_VALUES = {**{c: f"%({c})s{NULLABLE_LLM_CALL_CASTS.get(c, '')}" for c in LLM_CALL_COLUMNS},
                        "rolled_up": "TRUE"}
TURN_LLM_CALL_CTE = f""", llm_call AS (
    INSERT INTO "{LC}" ({columns_sql(LLM_CALL_COLUMNS)})
    SELECT {", ".join(TURN_LLM_CALL_VALUES[c] for c in LLM_CALL_COLUMNS)}
    FROM message WHERE (SELECT count(*) FROM usage) >= 0
    RETURNING "tenant_id", "created_at", "prompt_tokens", "completion_tokens", "cost_usd_micros"
), counted AS (
    {rollup_add_sql("llm_call")}
)"""
"""The LLMCall row of :data:`TURN_SAVE_SQL` (parameters named as its columns; the nullable
ones cast, since a NULL parameter in a SELECT list has no type of its own) and its count in
the usage rollup (:func:`rollup_add_sql` over the row it wrote, so both are written or
neither). Locks in the order the rollup's trigger took them when it counted this row at the
statement's end: the session, the run, then the rollup row (the ``WHERE`` on ``usage``, always
true, makes the run's update run before the call's rows are produced; without it a
concurrent transaction of the same run, its run then its rollup row, deadlocked with this
statement: sessions/tests/test_usage_month.py). The row is written ``rolled_up``, which the rollup's ``INSERT`` trigger skips
(``WHEN (NOT NEW.rolled_up)``: no trigger function call, no transition table on the turn's
save; bench/README.md, "What PostgreSQL spends per run")."""
TURN_SAVE_WITH_LLM_CALL_SQL = TURN_SAVE_SQL.format(llm_call=TURN_LLM_CALL_CTE)
TURN_SAVE_ONLY_SQL = TURN_SAVE_SQL.format(llm_call="")
TURN_SAVE_WITH_LLM_CALL_BODY_SQL = TURN_SAVE_SQL.format(
    llm_call=TURN_LLM_CALL_CTE.replace('RETURNING "tenant_id", "created_at"', 'RETURNING "id", "tenant_id", "created_at"', 1)
    + llm_call_body_cte("llm_call")
)
""":data:`TURN_SAVE_WITH_LLM_CALL_SQL` with the answering call's model call record (a tenant that
records bodies; :func:`llm_call_body_cte`)."""


TOOL_CALL_START_SQL = (
    f'UPDATE "{TC}" SET "status" = %(status)s, "started_at" = %(now)s '
    'WHERE "id" = %(pk)s AND "tenant_id" = %(tenant_id)s'
)



TOOL_CALL_FINISH_SQL = f"""
WITH done AS (
    UPDATE "{TC}" SET "status" = %(status)s, "result" = %(result)s, "result_data" = %(result_data)s::jsonb,
           "error" = %(error)s, "finished_at" = %(now)s, "duration_ms" = %(duration_ms)s
    WHERE "id" = %(pk)s AND "tenant_id" = %(tenant_id)s AND "finished_at" IS NULL
    RETURNING "call_id", "name"
), {take_position_cte(only_if="EXISTS (SELECT 1 FROM done)")}
INSERT INTO "{M}" ({columns_sql(MESSAGE_COLUMNS)})
SELECT %(tenant_id)s, %(session_id)s, %(run_id)s, taken.position, %(role)s, %(content)s, '', '[]'::jsonb,
       done."call_id", done."name", %(now)s
FROM done, taken
RETURNING "id"
"""
"""A tool call's outcome and its tool message in one statement: the call is updated only if
it has no result yet (the row lock decides between two attempts), and only then does the
message take the session's next position. One row: recorded; none: recorded before."""



def run_end_params(*, run_id: int, status: str, reply: str, error: str, reason: str) -> dict[str, Any]:
    """The parameters of every ``RUN_END_*`` statement (``session_id`` is added once known)."""
    return {
        "run_id": run_id, "tenant_id": require_tenant_id(), "status": status, "reply": clean_text(reply),
        "error": clean_text(error[:5000]),
        "reason": reason, "now": timezone.now(), "session_id": None,
        "call_cancelled": ToolCallStatus.CANCELLED.value, "approval_expired": ApprovalStatus.EXPIRED.value,
        "approval_pending": ApprovalStatus.PENDING.value, "queued": RunStatus.QUEUED.value,
        "active": [str(s) for s in ACTIVE_RUN_STATUSES],
    }


def run_ended(run_id: int, row: Any) -> tuple[int, int | None, bool]:
    """(session id, parent tool call id, whether it ended now) from ``RUN_END_SQL``'s row.

    Raises:
        Run.DoesNotExist: no row: no such run in the current tenant.
    """
    if row is None:
        raise Run.DoesNotExist(f"run {run_id} not found")
    return row[0], row[1], row[2]


RUN_END_SQL = (
    f'WITH ended AS (UPDATE "{RUN}" SET "status" = %(status)s, "reply" = %(reply)s, "error" = %(error)s, '
    '"reason" = %(reason)s, "finished_at" = %(now)s, "heartbeat_at" = NULL '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s AND "status" = ANY(%(active)s) '
    'RETURNING "session_id", "parent_tool_call_id") '
    'SELECT "session_id", "parent_tool_call_id", TRUE FROM ended '
    f'UNION ALL SELECT "session_id", "parent_tool_call_id", FALSE FROM "{RUN}" '
    'WHERE "id" = %(run_id)s AND "tenant_id" = %(tenant_id)s AND NOT EXISTS (SELECT 1 FROM ended)'
)
"""A run's end: only an active run (queued, running, awaiting approval) ends. One row: its
session, its parent tool call (a sub-run's) and TRUE if it ended now, FALSE if it had already
ended (the run is left as it was: a refused transition); no row: no such run. The second
SELECT reads the statement's snapshot, from before the UPDATE."""
SESSION_LOCK_SQL = (
    f'SELECT 1 FROM "{SESSION}" WHERE "id" = %(session_id)s AND "tenant_id" = %(tenant_id)s FOR NO KEY UPDATE'
)
RUN_END_CALLS_SQL = (
    f'UPDATE "{TC}" SET "status" = %(call_cancelled)s, "finished_at" = %(now)s '
    'WHERE "run_id" = %(run_id)s AND "tenant_id" = %(tenant_id)s AND "finished_at" IS NULL'
)
"""Calls left without a result (the run ended mid-turn) are recorded as cancelled."""
RUN_END_APPROVALS_SQL = (
    f'UPDATE "{Approval._meta.db_table}" SET "status" = %(approval_expired)s '
    'WHERE ("run_id" = %(run_id)s OR "sub_run_id" = %(run_id)s) AND "tenant_id" = %(tenant_id)s '
    'AND "status" = %(approval_pending)s'
)
"""A run's pending approvals expire when it ends: a user's run's own (``run``), or a sub-run's
(``sub_run``; they belong to the user's run)."""
NEXT_QUEUED_SQL = (
    f'SELECT "id" FROM "{RUN}" WHERE "session_id" = %(session_id)s '
    'AND "tenant_id" = %(tenant_id)s AND "status" = %(queued)s ORDER BY "id" LIMIT 1'
)
"""The session's next queued run (the one :func:`~sessions.runs.next_queued_run_id` and a run's
end hand to a worker)."""
RUN_END_NEXT_SQL = (
    f'SELECT ({NEXT_QUEUED_SQL}), '
    f'EXISTS (SELECT 1 FROM "{RUN}" WHERE "tenant_id" = %(tenant_id)s AND "status" = %(queued)s '
    'AND "held_back" AND "steered_into_id" IS NULL), '
    f'EXISTS (SELECT 1 FROM "{PUSH}" WHERE "run_id" = %(run_id)s AND "tenant_id" = %(tenant_id)s)'
)
"""The session's next queued run (:data:`NEXT_QUEUED_SQL`), whether the tenant has a
held-back run (else :func:`~sessions.runs.tenant_waiting_run_ids` has nothing to find), and
whether the run has an A2A push-notification config (``TaskPushConfig``; else the run-event
observers need not hear of its end for that, :func:`~sessions.runs.records.run_event_wanted`). Sent
after :data:`RUN_END_TENANT_LOCK_SQL`, as a statement of its own: it must see the held marks of
claims that took the lock first."""
RUN_END_TENANT_LOCK_SQL = f'SELECT 1 FROM "{TENANT}" WHERE "id" = %(tenant_id)s FOR NO KEY UPDATE'
"""A run's end takes its tenant's row lock (as a claim does, :data:`CLAIM_LOCK_TENANT_SQL`)
before it looks for held-back runs. Either a claim refused for the limit committed its held
mark first, and the end sees it; or the end committed first, and the claim counts the ended
run as no longer working. Without it a claim could count the ending run, be refused, and mark
itself held after the end looked: a run left queued until the sweeper's resend."""

