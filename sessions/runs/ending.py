"""A run's end: active → completed | failed | cancelled.

:func:`run_end` is the one place a run's end is written (with the runs steered into it, its
sub-runs still active, its calls left without a result and its pending approvals); the callers
publish: :func:`run_finish` (the worker holding the run, after the commit, through the run's
``publish``), :func:`run_finish_unheld` (a run no worker holds, on the caller's commit) and
:func:`sessions.runs.subruns.subrun_finish`. ``run_finish`` of a first attempt with no steering
and no sub-runs runs the same statements pipelined on the loop's own connection
(:func:`_run_end_pipelined`). Runs that may start once this one ended are handed to workers
(:mod:`sessions.runs.handoff`). Every function expects the caller's tenant scope.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import connection, transaction

from sessions.events import event_publish, event_publish_on_commit
from sessions.models import ACTIVE_RUN_STATUSES, Approval, ApprovalStatus, Run, RunStatus, ToolCall, ToolCallStatus
from sessions.runner.cancellation import CANCEL_REASON
from sessions.runner.pg import pg_connection, pipelined_transaction
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db
from sessions.runs import statements as sql
from sessions.runs.claim import tenant_waiting_run_ids
from sessions.runs.handoff import run_enqueue_on_commit, runs_hand_to_workers
from sessions.runs.records import Publish, run_event_observe, run_event_observers, run_event_wanted
from tenants.scoping import require_tenant_id

logger = logging.getLogger(__name__)


class RunEnding(Protocol):
    """How a run ends, as the runner's outcomes carry it (``sessions.runner.turn.Completed``,
    ``Failed``, ``Cancelled``)."""

    status: str
    reply: str
    error: str
    reason: str


def end_event(ending: RunEnding) -> tuple[str, dict[str, Any]]:
    """The event announcing ``ending``: ``run_completed {reply}`` (``attributions`` added when
    the ending carries the platform's attribution, not None), ``run_cancelled {reason}`` or
    ``run_failed {error, reason}``."""
    if ending.status == RunStatus.COMPLETED:
        attributions = getattr(ending, "attributions", None)
        if attributions is not None:
            return "run_completed", {"reply": ending.reply, "attributions": attributions}
        return "run_completed", {"reply": ending.reply}
    if ending.status == RunStatus.CANCELLED:
        return "run_cancelled", {"reason": CANCEL_REASON}
    return "run_failed", {"error": ending.error, "reason": ending.reason}



# --- active → completed | failed | cancelled: the end -------------------------------------


@dataclass(frozen=True, slots=True)
class RunFinished:
    """What a run's end did."""

    to_start: list[int]
    """Run ids to hand to workers now: the session's next queued run, and held-back runs of
    the tenant (their claims were refused for its limit: heads of their sessions, oldest
    first, at most the number of free slots)."""
    steered: list[int]
    """Runs whose messages were steered into this one, ended with it."""
    ended: bool = True
    """False: the run had already ended; nothing was written (a refused transition)."""
    push_configured: bool = True
    """Whether the run had an A2A push-notification config at its end (True when not looked at:
    a sub-run's or a refused end)."""


_REFUSED = RunFinished(to_start=[], steered=[], ended=False)


async def run_finish(run_id: int, ending: RunEnding, *, publish: Publish, spec: RunSpec | None = None) -> RunFinished:
    """End the run the caller's worker holds: ``completed``, ``failed`` (with ``reason``) or
    ``cancelled``, with the runs steered into it and its sub-runs still active; calls left
    without a result are recorded ``cancelled``, pending approvals expire.

    ``spec``: the run's (None: a run that never got one, e.g. its configuration failed).
    The first attempt of a run of an agent neither in steer mode nor with skills cannot have
    steered runs or sub-runs: its end is the plain-SQL fast path, one pipelined transaction on
    the loop's async connection; any other end is :func:`run_end` on a thread.

    Emits after the commit, once the run event observers heard of the end (as
    :func:`~sessions.runs.transitions.run_pause` does): the end event (:func:`end_event`) of the
    run through ``publish``, and of each steered run (``steered_into`` added); then hands the
    session's next queued run and the tenant's waiting runs to workers. Nothing when refused
    (the run had already ended, e.g. failed ``worker_lost`` by the sweeper while this worker
    was stalled).

    Raises:
        Run.DoesNotExist: no such run in the current tenant.
    """
    fields = {"run_id": run_id, "status": ending.status, "reply": ending.reply, "error": ending.error,
              "reason": ending.reason}
    if spec is not None and spec.attempt == 1 and not spec.steer and not spec.starts_subruns and spec.depth == 0:
        finished = await _run_end_pipelined(**fields, session_id=spec.session_id)
    else:
        finished = await db(run_end)(**fields)
    if not finished.ended:
        logger.warning("run %s had already ended; its end as %s was not recorded", run_id, ending.status)
        return finished
    event_type, data = end_event(ending)
    tenant_id = require_tenant_id()
    if run_event_observers and run_event_wanted(tenant_id, event_type, push_configured=finished.push_configured):
        await db(run_event_observe)(tenant_id, run_id, event_type, data)  # before the event: see run_pause
    await publish(event_type, data)
    if finished.steered:
        session_id = spec.session_id if spec is not None else await db(_session_of)(run_id)
        for steered_id in finished.steered:  # a run steered into this one ends with it
            await event_publish(session_id=session_id, run_id=steered_id, type=event_type,
                                data={**data, "steered_into": run_id})
    await runs_hand_to_workers(finished.to_start)
    return finished


def _session_of(run_id: int) -> int:
    return Run.objects.values_list("session_id", flat=True).get(pk=run_id)


@transaction.atomic
def run_end(
    *, run_id: int, status: str, reply: str = "", error: str = "", reason: str = "",
    may_have_steered: bool = True, may_have_subruns: bool = True,
) -> RunFinished:
    """Record the run's end (and of the runs steered into it, and of its sub-runs still
    active), publishing nothing: the core of :func:`run_finish`, :func:`run_finish_unheld` and
    :func:`~sessions.runs.subruns.subrun_finish`, which publish. In the caller's transaction, if any.

    ``may_have_steered`` / ``may_have_subruns`` False (the caller knows the agent is not in
    steer mode / has no skills) skip those lookups.

    The run's row, then its session's, are locked (in that order) until the commit, so a claim
    of the session's next run sees this one ended. Plain SQL for the statements every run
    makes (the ORM's were most of this call's ~4 ms of CPU).

    Returns:
        :class:`RunFinished` (``ended`` False and nothing written if it had already ended).

    Raises:
        Run.DoesNotExist: no such run in the current tenant.
    """
    params = sql.run_end_params(run_id=run_id, status=status, reply=reply, error=error, reason=reason)
    now, tenant_id = params["now"], params["tenant_id"]
    with connection.cursor() as cursor:
        cursor.execute(sql.RUN_END_SQL, params)
        params["session_id"], parent_tool_call_id, ended = sql.run_ended(run_id, cursor.fetchone())
        if not ended:
            return _REFUSED
        cursor.execute(sql.SESSION_LOCK_SQL, params)
    steered: list[int] = []
    if may_have_steered:
        steered = list(Run.objects.filter(steered_into_id=run_id).order_by("pk").values_list("pk", flat=True))
        if steered:
            Run.objects.filter(pk__in=steered).update(
                status=status, reply=params["reply"], error=params["error"], reason=reason, finished_at=now,
            )
    with connection.cursor() as cursor:
        cursor.execute(sql.RUN_END_CALLS_SQL, params)
        cursor.execute(sql.RUN_END_APPROVALS_SQL, params)
        if may_have_subruns:
            _subruns_end_with_parent(run_id=run_id, now=now)
        if parent_tool_call_id is not None:  # a sub-run starts nothing: its parent still holds the session
            return RunFinished(to_start=[], steered=steered)
        cursor.execute(sql.RUN_END_TENANT_LOCK_SQL, params)
        cursor.execute(sql.RUN_END_NEXT_SQL, params)
        next_id, tenant_has_held, push_configured = cursor.fetchone()
    out = [] if next_id is None else [next_id]
    if tenant_has_held:
        out += [i for i in tenant_waiting_run_ids(tenant_id) if i not in out]
    return RunFinished(to_start=out, steered=steered, push_configured=push_configured)


async def _run_end_pipelined(
    *, run_id: int, session_id: int, status: str, reply: str = "", error: str = "", reason: str = "",
) -> RunFinished:
    """:func:`run_end` for a user's run that nothing was steered into and that started no
    sub-run, on the loop's async connection: the same statements in one transaction, sent
    together in one round trip (:func:`~sessions.runner.pg.pipelined_transaction`), no thread.
    ``session_id`` comes from the run's spec, so that no statement waits for another's
    result. Only if the tenant has held-back runs does it ask a thread which of them may start.

    Raises:
        Run.DoesNotExist: no such run in the current tenant (nothing changed then).
    """
    params = sql.run_end_params(run_id=run_id, status=status, reply=reply, error=error, reason=reason)
    params["session_id"] = session_id
    async with pg_connection() as conn:
        async with pipelined_transaction(conn):
            end = await conn.execute(sql.RUN_END_SQL, params)
            await conn.execute(sql.SESSION_LOCK_SQL, params)
            # For a run that had already ended these find nothing left to change: its end did it.
            await conn.execute(sql.RUN_END_CALLS_SQL, params)
            await conn.execute(sql.RUN_END_APPROVALS_SQL, params)
            await conn.execute(sql.RUN_END_TENANT_LOCK_SQL, params)
            following = await conn.execute(sql.RUN_END_NEXT_SQL, params)
        # Committed, unless the run is not there: then every statement changed nothing.
        _, _, ended = sql.run_ended(run_id, await end.fetchone())
        if not ended:
            return _REFUSED
        next_id, tenant_has_held, push_configured = await following.fetchone()
    out = [] if next_id is None else [next_id]
    if tenant_has_held:
        waiting = await db(tenant_waiting_run_ids)(params["tenant_id"])
        out += [i for i in waiting if i not in out]
    return RunFinished(to_start=out, steered=[], push_configured=push_configured)


def run_finish_unheld(*, run: Run, status: str, error: str, reason: str = "", event_data: dict[str, Any]) -> bool:
    """End a run no worker holds (awaiting approval, or orphaned by a dead worker), in the
    caller's transaction: :func:`run_end`, its end event ``event_data`` (and of the runs
    steered into it, ``steered_into`` added) published on commit, and the runs that may now
    start handed to workers on commit. ``status``: ``failed`` or ``cancelled``.

    Returns:
        Whether it ended (False: it had already ended; nothing written or published).
    """
    event_type = {RunStatus.CANCELLED: "run_cancelled", RunStatus.FAILED: "run_failed"}[status]
    finished = run_end(run_id=run.pk, status=status, error=error, reason=reason)
    if not finished.ended:
        return False
    for steered_id in finished.steered:
        event_publish_on_commit(session_id=run.session_id, run_id=steered_id, type=event_type,
                                data={**event_data, "steered_into": run.pk})
    if run_event_observers:  # before the event (on_commit keeps the order): see run_pause
        tenant_id = run.tenant_id
        transaction.on_commit(lambda: run_event_observe(tenant_id, run.pk, event_type, event_data))
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type=event_type, data=event_data)
    for run_id in finished.to_start:
        run_enqueue_on_commit(run_id=run_id)
    return True



# --- the sub-runs of an ending run ------------------------------------------------------


def _subruns_end_with_parent(*, run_id: int, now: datetime) -> int:
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

