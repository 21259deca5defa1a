"""Run status transitions: each one named function, the only code that writes ``Run.status``.

See :mod:`sessions.runs` for the transition table. Two kinds of caller:

- the API services and the sweeper (synchronous, inside their transaction): the function
  writes under the run's row lock and publishes its event with
  :func:`sessions.events.event_publish_on_commit` (nothing if the transaction rolls back);
- the runner (``async def``, on the run host's loop): the function commits first (its own
  transaction, on a :func:`~sessions.runner.threads.db` thread or the loop's async
  connection), then publishes through the run's ``publish`` callable, then hands any runs
  that may now start to workers.

A transition the run's current status does not allow is refused: nothing is written, nothing
is published, and the function says so (``False``, ``None``, :attr:`RunFinished.ended` False,
:class:`RunNotClaimable`, or an ``ApplicationError`` 409 for an API caller).

Every function expects the caller's tenant scope (the runner sets it from the run row it
claims) and filters by it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from sessions.events import event_publish, event_publish_on_commit
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalKind,
    ApprovalStatus,
    ChatSession,
    Message,
    MessageRole,
    Run,
    RunFailureReason,
    RunStatus,
    ToolCall,
    ToolCallStatus,
)
from sessions.runner.cancellation import CANCEL_ERROR, CANCEL_REASON
from sessions.runner.pg import pg_connection, pipelined_transaction
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db
from sessions.runs import statements as sql
from sessions.runs.records import approval_payload, message_insert
from tenants.audit import Action, audit_record
from tenants.models import Tenant
from tenants.scoping import current_tenant_id, require_tenant_id

logger = logging.getLogger(__name__)

T = TypeVar("T")

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""The run's publisher: ``await publish(event_type, data)`` puts an event of this run on its
session's stream (the runner's closure; a sub-run's adds its parent's ids)."""


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


# --- queued: create, enqueue --------------------------------------------------------------


def run_enqueue_on_commit(*, run_id: int) -> None:
    """Hand the run to a worker once the transaction commits (with the tenant in context, if
    one: callers work in the run's tenant). Sending twice is harmless: the claim decides."""
    from sessions.tasks import run_enqueue

    tenant_id = current_tenant_id()
    transaction.on_commit(lambda: run_enqueue(run_id, tenant_id))


def run_create(*, session: ChatSession, user: AbstractBaseUser, content: str) -> Run:
    """A new run (``queued``) answering ``content``, the user's message written with it.

    ``session`` must be locked by the caller (``select_for_update``) inside its transaction;
    its next message position is taken and saved (with any ``title`` the caller set on it).
    If the agent is in ``steer`` mode and a run of the session is active, the run is marked
    ``steer`` (the running run may absorb it, :func:`steer_absorb`).

    Emits ``run_queued {input}`` on commit and hands the run to a worker on commit.
    """
    steer = session.agent.message_mode == "steer" and Run.objects.filter(
        session=session, status__in=ACTIVE_RUN_STATUSES
    ).exists()
    run = Run.objects.create(tenant_id=session.tenant_id, session=session, user=user, input=content, steer=steer)
    Message.objects.create(
        tenant_id=session.tenant_id, session=session, run=run, role=MessageRole.USER,
        content=content, position=session.next_position,
    )
    session.next_position += 1
    session.save(update_fields=["next_position", "title", "updated_at"])
    event_publish_on_commit(session_id=session.pk, run_id=run.pk, type="run_queued", data={"input": content})
    run_enqueue_on_commit(run_id=run.pk)
    return run


def next_queued_run_id(*, session_id: int) -> int | None:
    """The session's next queued run (the lowest id), or None."""
    with connection.cursor() as cursor:
        cursor.execute(sql.NEXT_QUEUED_SQL, {"session_id": session_id, "tenant_id": require_tenant_id(),
                                             "queued": RunStatus.QUEUED.value})
        row = cursor.fetchone()
    return row[0] if row else None


def stale_before() -> datetime:
    """Heartbeats older than this are a dead worker's (now − ``RUN_STALE_SECONDS``)."""
    from datetime import timedelta

    from django.conf import settings

    return timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS)


def tenant_run_limit(max_concurrent_runs: int | None) -> int:
    """A tenant's limit on working runs: its own (``Tenant.max_concurrent_runs``), else
    ``RUNS_PER_TENANT_DEFAULT``."""
    from django.conf import settings

    return max_concurrent_runs if max_concurrent_runs is not None else settings.RUNS_PER_TENANT_DEFAULT


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


async def _hand_to_workers(run_ids: list[int]) -> None:
    """Hand runs to workers (each claim re-checks that it may start), from the run host's loop."""
    if not run_ids:
        return
    from asgiref.sync import sync_to_async

    from sessions.tasks import run_enqueue

    for run_id in run_ids:
        await sync_to_async(run_enqueue)(run_id, current_tenant_id())  # runs of the caller's tenant


# --- queued | running → running: the claim -----------------------------------------------


class RunNotClaimable(Exception):
    """The run is finished, unknown, or must wait for an earlier run of its session."""


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """The columns of a just-claimed run that the runner's configuration load needs."""

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


async def run_claim(run_id: int, *, load: Callable[[ClaimedRun], T]) -> T:
    """Mark the run ``running`` (attempt + 1, heartbeat now), then ``load`` what it needs.

    A ``running`` run whose heartbeat is stale (older than ``RUN_STALE_SECONDS``) is claimed
    again: its worker died (a redelivery or the sweeper), and the run resumes from what it
    persisted. A ``running`` run with a fresh heartbeat belongs to a live worker and is
    refused, so a duplicate delivery never runs a run twice at once.

    A ``queued`` run starts only while its tenant has fewer runs working than its limit
    (``Tenant.max_concurrent_runs``, else ``RUNS_PER_TENANT_DEFAULT``); otherwise it stays
    queued and :func:`run_finish` of one of the tenant's runs hands it to a worker later.

    The claim is one short transaction (the tenant's row lock is held for a count and an
    update, so many runs of one tenant can start at once); ``load`` (the runner's
    configuration read) runs after it commits, on the same thread.

    Emits ``run_running {attempt}`` once the claim committed and ``load`` returned.

    Raises:
        RunNotClaimable: finished, missing, awaiting approval, held by a live worker, an
            earlier run of the session is active, or the tenant is at its limit.
        ValueError: from ``load`` (the agent's configuration is unusable: no route
            entries…); the run is claimed by then, and the caller ends it failed. Nothing is
            published then.
    """
    claimed, loaded = await db(_claim_and_load)(run_id, load)
    await event_publish(session_id=claimed.session_id, run_id=run_id, type="run_running",
                        data={"attempt": claimed.attempt})
    return loaded


def _claim_and_load(run_id: int, load: Callable[[ClaimedRun], T]) -> tuple[ClaimedRun, T]:
    claimed = _claim(run_id)
    return claimed, load(claimed)


@transaction.atomic
def _claim(run_id: int) -> ClaimedRun:
    """The claim's transaction (see :func:`run_claim`): lock the session, then the run; check
    it may start; last, for a queued run, lock the tenant and count its working runs; mark it
    running. Plain SQL: the ORM's version was most of a claim's CPU (bench/README.md)."""
    params: dict[str, Any] = {"run_id": run_id, "tenant_id": require_tenant_id()}
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_SESSION_OF_RUN_SQL, params)
        row = cursor.fetchone()
        if row is None:
            raise RunNotClaimable(f"run {run_id} not found")
        params["session_id"] = row[0]
        cursor.execute(sql.CLAIM_LOCK_SESSION_SQL, params)  # serialises runs of a session
        (agent_id,) = cursor.fetchone()
        cursor.execute(sql.CLAIM_LOCK_RUN_SQL, params)  # a concurrent cancel wins
        status, heartbeat_at, steered_into_id, user_id, loop_count, paused_seconds = cursor.fetchone()
        _check_claimable(run_id, status, heartbeat_at, steered_into_id)
        cursor.execute(sql.CLAIM_EARLIER_ACTIVE_SQL, {**params, "active": [str(s) for s in ACTIVE_RUN_STATUSES]})
        if cursor.fetchone()[0]:
            raise RunNotClaimable(f"run {run_id} waits for an earlier run of its session")
        params.update(running=RunStatus.RUNNING.value, now=timezone.now())
        if status == RunStatus.QUEUED:
            _check_tenant_slot(cursor, run_id, params)
        cursor.execute(sql.CLAIM_UPDATE_SQL, params)
        attempt, started_at = cursor.fetchone()
    return ClaimedRun(
        pk=run_id, tenant_id=params["tenant_id"], session_id=params["session_id"], user_id=user_id,
        agent_id=agent_id, attempt=attempt, loop_count=loop_count, started_at=started_at,
        paused_seconds=paused_seconds,
    )


def _check_claimable(run_id: int, status: str, heartbeat_at: datetime | None, steered_into_id: int | None) -> None:
    if status not in (RunStatus.QUEUED, RunStatus.RUNNING):
        raise RunNotClaimable(f"run {run_id} is {status}")
    if status == RunStatus.RUNNING and heartbeat_at is not None and heartbeat_at > stale_before():
        raise RunNotClaimable(f"run {run_id} is held by a live worker (heartbeat {heartbeat_at.isoformat()})")
    if steered_into_id is not None:
        raise RunNotClaimable(f"run {run_id} was handed to run {steered_into_id}")


def _check_tenant_slot(cursor: Any, run_id: int, params: dict[str, Any]) -> None:
    """Last before the commit: the tenant's claims queue on this lock, so hold it briefly."""
    cursor.execute(sql.CLAIM_LOCK_TENANT_SQL, params)
    slug, max_concurrent_runs = cursor.fetchone()
    limit = tenant_run_limit(max_concurrent_runs)
    cursor.execute(sql.CLAIM_WORKING_SQL, {**params, "stale_before": stale_before()})
    working = cursor.fetchone()[0]
    if working >= limit:
        raise RunNotClaimable(f"run {run_id} waits: tenant {slug} has {working} of {limit} runs working")


async def run_heartbeat(run_id: int, attempt: int) -> bool:
    """Write the run's heartbeat for the worker holding ``attempt`` (not a transition).

    Returns:
        False if the run is no longer ``running`` under this attempt (it ended, paused, or
        another worker took it over after this one's heartbeat went stale).
    """
    async with pg_connection() as conn:
        cursor = await conn.execute(
            f'UPDATE "{sql.RUN}" SET "heartbeat_at" = %s '
            'WHERE "id" = %s AND "tenant_id" = %s AND "status" = %s AND "attempt" = %s',
            [timezone.now(), run_id, require_tenant_id(), RunStatus.RUNNING.value, attempt],
        )
        return cursor.rowcount == 1


# --- queued (steer) → running: steering ---------------------------------------------------


@transaction.atomic
def steer_absorb(run_id: int) -> list[int]:
    """Hand the session's queued steer messages to running run ``run_id``.

    Runs posted in steer mode after ``run_id`` that are still queued become part of it
    (``steered_into``; status running): their user messages move to the end of the history
    (new positions: they were written while this run's tool calls were still being answered,
    and a call/result pair must not be split) and they end as this run ends. Called only
    between model turns, when every tool call of the run has its result.

    Emits ``run_running {steered_into}`` for each absorbed run on commit.

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
    for steered_id in ids:
        event_publish_on_commit(session_id=run.session_id, run_id=steered_id, type="run_running",
                                data={"steered_into": run_id})
    return ids


# --- running → awaiting_approval → queued: pause and resume -----------------------------


async def run_pause(run_id: int, *, publish: Publish) -> bool:
    """The run waits for approvals: ``awaiting_approval``, no worker holds it (the runner's
    loop returned ``Paused``).

    If every approval was already decided meanwhile (a fast approver), the run is queued
    again instead and handed to a worker. Either way, queued runs of the tenant that were
    waiting for the slot it frees are handed to workers.

    Emits ``run_awaiting_approval {approvals}`` after the commit when it paused.

    Returns:
        Whether the run paused (False: it was queued again at once).
    """
    approvals, to_start = await db(_pause)(run_id)
    if approvals:
        await publish("run_awaiting_approval", {"approvals": approvals})
    await _hand_to_workers(to_start)
    return bool(approvals)


@transaction.atomic
def _pause(run_id: int) -> tuple[list[dict[str, Any]], list[int]]:
    """:func:`run_pause`'s transaction: (the pending approvals as event payloads, run ids to
    hand to workers)."""
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    pending = list(
        Approval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).select_related("sub_run__skill")
        .order_by("id")
    )
    if not pending:
        run.status = RunStatus.QUEUED
        run.heartbeat_at = None
        run.save(update_fields=["status", "heartbeat_at"])
        return [], [run_id]
    run.status = RunStatus.AWAITING_APPROVAL
    run.paused_at = timezone.now()
    run.heartbeat_at = None
    run.save(update_fields=["status", "paused_at", "heartbeat_at"])
    Run.objects.filter(steered_into_id=run_id).update(status=RunStatus.AWAITING_APPROVAL)
    return [approval_payload(a) for a in pending], tenant_waiting_run_ids(run.tenant_id)


def run_resume(*, run: Run, now: datetime) -> bool:
    """Queue paused user's run ``run`` (locked by the caller) again if none of its approvals
    (its sub-runs' included) is pending: ``awaiting_approval`` → ``queued`` (``paused_seconds``
    grows by the wait; runs steered into it go back to ``running`` with it).

    Emits ``run_queued {resumed: true}`` and hands the run to a worker on commit.

    Returns:
        Whether it was queued (False: it is not paused, or an approval is still pending).
    """
    if run.status != RunStatus.AWAITING_APPROVAL or Approval.objects.filter(
        run=run, status=ApprovalStatus.PENDING
    ).exists():
        return False
    run.status = RunStatus.QUEUED
    if run.paused_at is not None:
        run.paused_seconds += (now - run.paused_at).total_seconds()
    run.paused_at = None
    run.save(update_fields=["status", "paused_seconds", "paused_at"])
    Run.objects.filter(steered_into=run).update(status=RunStatus.RUNNING)
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="run_queued", data={"resumed": True})
    run_enqueue_on_commit(run_id=run.pk)
    return True


# --- active → completed | failed | cancelled: the end -------------------------------------


@dataclass(frozen=True, slots=True)
class RunFinished:
    """What a run's end did."""

    to_start: list[int]
    """Run ids to hand to workers now: the session's next queued run, and queued runs of the
    tenant that were waiting for a free slot (heads of their sessions, oldest first, at most
    the number of free slots)."""
    steered: list[int]
    """Runs whose messages were steered into this one, ended with it."""
    ended: bool = True
    """False: the run had already ended; nothing was written (a refused transition)."""


_REFUSED = RunFinished(to_start=[], steered=[], ended=False)


async def run_finish(run_id: int, ending: RunEnding, *, publish: Publish, spec: RunSpec | None = None) -> RunFinished:
    """End the run the caller's worker holds: ``completed``, ``failed`` (with ``reason``) or
    ``cancelled``, with the runs steered into it and its sub-runs still active; calls left
    without a result are recorded ``cancelled``, pending approvals expire.

    ``spec``: the run's (None: a run that never got one, e.g. its configuration failed).
    The first attempt of a run of an agent neither in steer mode nor with skills cannot have
    steered runs or sub-runs: its end is the plain-SQL fast path, one pipelined transaction on
    the loop's async connection; any other end is :func:`run_end` on a thread.

    Emits after the commit: the end event (:func:`end_event`) of the run through ``publish``,
    and of each steered run (``steered_into`` added); then hands the session's next queued run
    and the tenant's waiting runs to workers. Nothing when refused (the run had already ended,
    e.g. failed ``worker_lost`` by the sweeper while this worker was stalled).

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
    await publish(event_type, data)
    if finished.steered:
        session_id = spec.session_id if spec is not None else await db(_session_of)(run_id)
        for steered_id in finished.steered:  # a run steered into this one ends with it
            await event_publish(session_id=session_id, run_id=steered_id, type=event_type,
                                data={**data, "steered_into": run_id})
    await _hand_to_workers(finished.to_start)
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
    :func:`subrun_finish`, which publish. In the caller's transaction, if any.

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
        cursor.execute(sql.RUN_END_NEXT_SQL, params)
        next_id, tenant_has_queued = cursor.fetchone()
    out = [] if next_id is None else [next_id]
    if tenant_has_queued:
        out += [i for i in tenant_waiting_run_ids(tenant_id, known_queued=True) if i not in out]
    return RunFinished(to_start=out, steered=steered)


async def _run_end_pipelined(
    *, run_id: int, session_id: int, status: str, reply: str = "", error: str = "", reason: str = "",
) -> RunFinished:
    """:func:`run_end` for a user's run that nothing was steered into and that started no
    sub-run, on the loop's async connection: the same statements in one transaction, sent
    together in one round trip (:func:`~sessions.runner.pg.pipelined_transaction`), no thread.
    ``session_id`` comes from the run's spec, so that no statement waits for another's
    result. Only if the tenant has queued runs does it ask a thread which of them may start.

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
            following = await conn.execute(sql.RUN_END_NEXT_SQL, params)
        # Committed, unless the run is not there: then every statement changed nothing.
        _, _, ended = sql.run_ended(run_id, await end.fetchone())
        if not ended:
            return _REFUSED
        next_id, tenant_has_queued = await following.fetchone()
    out = [] if next_id is None else [next_id]
    if tenant_has_queued:
        waiting = await db(tenant_waiting_run_ids)(params["tenant_id"], known_queued=True)
        out += [i for i in waiting if i not in out]
    return RunFinished(to_start=out, steered=[])


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
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type=event_type, data=event_data)
    for run_id in finished.to_start:
        run_enqueue_on_commit(run_id=run_id)
    return True


@transaction.atomic
def run_cancel(*, run: Run) -> Run:
    """Cancel ``run``: at once if it is queued, through its worker if it is running.

    - ``queued``: marked ``cancelled`` here (error "Cancelled by the user.", ``reason`` "")
      under ``select_for_update`` of the run; the claim then refuses it. If no run of the
      session is running, the session's next queued run is handed to a worker (nobody else
      would start it).
    - ``awaiting_approval``: no worker holds it; ended ``cancelled`` here, its pending
      approvals expire. A skill's sub-run waiting inside its user's paused run: the same,
      and the user's run resumes if nothing else is pending (its skill call then fails
      with "cancelled").
    - ``running``: only the Redis cancel signal is set; the worker stops the run within
      about a second and records ``cancelled`` itself (the returned run is still ``running``).
    - a run whose message was steered into a running run: that run is cancelled.

    The signal is set in both cases (on commit): a queued run claimed at the same moment is
    then stopped by its worker.

    Returns:
        The run as stored after the call (``cancelled``, or still ``running``).

    Raises:
        ApplicationError: (409) the run has already finished.

    Requires tenant scope. Emits ``run_cancelled`` ``{reason}`` on commit for a queued or
    paused run (the worker emits it for a running one).
    """
    from sessions.runner.cancellation import request_cancel_sync

    user_run = None
    if run.parent_tool_call_id is not None:  # lock order: the user's run, then its sub-run (as run_end)
        user_run = Run.objects.select_for_update(no_key=True).get(pk=_user_run_id(run))
    run = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
    if run.status not in ACTIVE_RUN_STATUSES:
        raise ApplicationError("The run has already finished.", status_code=409)
    if run.steered_into_id is not None:  # its message was handed to a running run: cancel that one
        return run_cancel(run=Run.objects.get(pk=run.steered_into_id))
    if run.status == RunStatus.AWAITING_APPROVAL and user_run is not None:
        _sub_run_cancel_waiting(run=run, user_run=user_run)
        run.refresh_from_db()
        return run
    if run.status == RunStatus.AWAITING_APPROVAL:  # no worker holds it: end it here
        run_finish_unheld(run=run, status=RunStatus.CANCELLED, error=CANCEL_ERROR,
                          event_data={"reason": CANCEL_REASON})
        run.refresh_from_db()
        return run
    if run.status == RunStatus.QUEUED:
        _cancel_queued(run)
    run_id = run.pk
    transaction.on_commit(lambda: request_cancel_sync(run_id))
    return run


def _cancel_queued(run: Run) -> None:
    """``queued`` → ``cancelled`` (``run`` locked by the caller); the session's next queued run
    is handed to a worker if none of the session's runs is running."""
    run.status = RunStatus.CANCELLED
    run.error = CANCEL_ERROR
    run.reason = ""
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "reason", "finished_at"])
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="run_cancelled",
                            data={"reason": CANCEL_REASON})
    if not Run.objects.filter(session_id=run.session_id, status=RunStatus.RUNNING).exists():
        next_run_id = next_queued_run_id(session_id=run.session_id)
        if next_run_id is not None:
            run_enqueue_on_commit(run_id=next_run_id)


def _user_run_id(run: Run) -> int:
    """The user's run (depth 0) at the top of sub-run ``run``'s tree (``run`` itself for a user's run)."""
    run_id, parent_call_id = run.pk, run.parent_tool_call_id
    while parent_call_id is not None:
        run_id = ToolCall.objects.values_list("run_id", flat=True).get(pk=parent_call_id)
        parent_call_id = Run.objects.values_list("parent_tool_call_id", flat=True).get(pk=run_id)
    return run_id


def _sub_run_cancel_waiting(*, run: Run, user_run: Run) -> None:
    """Cancel sub-run ``run`` (locked, ``awaiting_approval``): no worker holds it or the runs
    above it. It ends ``cancelled`` (its pending approvals and those of the sub-runs below it
    expire); ``user_run`` (locked before ``run``, the order :func:`run_end` locks in) resumes
    if nothing else is pending, executes the skill call again and hears that the skill was
    cancelled."""
    _subrun_end(run_id=run.pk, status=RunStatus.CANCELLED, error=CANCEL_ERROR)
    parent_run_id = ToolCall.objects.values_list("run_id", flat=True).get(pk=run.parent_tool_call_id)
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="run_cancelled", data={
        "reason": CANCEL_REASON, "parent_run_id": parent_run_id, "parent_tool_call_id": run.parent_tool_call_id,
    })
    run_resume(run=user_run, now=timezone.now())


# --- approvals: decided → the run resumes; expired → the run fails -------------------------


def approval_decide(*, approval: Approval, user: AbstractBaseUser, decision: str = "", reason: str = "",
                    answer: str = "") -> Approval:
    """Record a human's decision on a pending approval; resume the run once none is pending.

    Args:
        approval: A tool-call approval or an ``ask_user`` question of the caller's run.
        decision: ``approve`` or ``deny`` (tool-call approvals).
        reason: Optional, for a denial: fed back to the model with the failed call.
        answer: The answer to a question (required, ≤ 10,000 characters).

    Returns:
        The approval as stored. When the run has no pending approval left it is queued again
        (:func:`run_resume`).

    Raises:
        ApplicationError: 400 for a missing/invalid decision or answer; 409 when the approval
            was already decided, has expired (the run then fails ``approval_expired``) or its
            run is no longer waiting.

    Emits ``approval_resolved`` ``{approval_id, tool_call_id, status, sub_run_id}`` on commit.
    """
    with transaction.atomic():  # committed before the caller gets its 409
        expired = approvals_expire(run_ids=[approval.run_id], approval_ids=[approval.pk])
    if expired:
        raise ApplicationError("This approval has expired; the run has failed.", status_code=409)
    return _approval_decide(approval=approval, user=user, decision=decision, reason=reason, answer=answer,
                            now=timezone.now())


def _check_decision(approval: Approval, *, decision: str, answer: str) -> str:
    """The cleaned answer; ApplicationError (400) for a missing/invalid decision or answer."""
    if approval.kind == ApprovalKind.QUESTION:
        answer = (answer or "").strip()
        if not answer:
            raise ApplicationError("Send the answer to the question in `answer`.")
        if len(answer) > 10_000:
            raise ApplicationError("The answer is longer than 10000 characters.")
    elif decision not in ("approve", "deny"):
        raise ApplicationError("`decision` must be 'approve' or 'deny'.")
    return answer


@transaction.atomic
def _approval_decide(*, approval: Approval, user: AbstractBaseUser, decision: str, reason: str, answer: str,
                     now: datetime) -> Approval:
    run = Run.objects.select_for_update(no_key=True).get(pk=approval.run_id)
    approval = Approval.objects.select_for_update(no_key=True).get(pk=approval.pk)
    answer = _check_decision(approval, decision=decision, answer=answer)
    if approval.status != ApprovalStatus.PENDING:
        raise ApplicationError(f"This approval is already {approval.status}.", status_code=409)
    if run.status not in ACTIVE_RUN_STATUSES:  # running/queued: the worker is about to pause it
        raise ApplicationError(f"The run is {run.status}; it no longer waits for this approval.", status_code=409)
    if approval.expires_at <= now:
        raise ApplicationError("This approval has expired.", status_code=409)
    if approval.kind == ApprovalKind.QUESTION:
        approval.status, approval.answer = ApprovalStatus.ANSWERED, answer
    else:
        approval.status = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.DENIED
        approval.answer = (reason or "").strip()[:2000]
    approval.decided_by = user
    approval.decided_at = now
    approval.save(update_fields=["status", "answer", "decided_by", "decided_at"])
    # the decision goes in the audit log (never the answer's or reason's text)
    audit_record(action=Action.APPROVAL_DECIDED, obj=approval, actor=user,
                 changes={"status": {"from": ApprovalStatus.PENDING, "to": approval.status}},
                 detail={"run_id": run.pk, "tool_call_id": approval.tool_call_id, "kind": approval.kind})
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="approval_resolved", data={
        "approval_id": approval.pk, "tool_call_id": approval.tool_call_id, "status": approval.status,
        "sub_run_id": approval.sub_run_id,
    })
    run_resume(run=run, now=now)
    return approval


APPROVAL_EXPIRED_ERROR = "Nobody answered the approval request in time."


def approvals_expire(*, now: datetime | None = None, run_ids: list[int] | None = None,
                     approval_ids: list[int] | None = None) -> int:
    """Expire pending approvals past ``expires_at``; their runs fail with ``approval_expired``
    (:func:`run_finish_unheld`), in the caller's transaction.

    Args:
        now: The time to compare with (default: now).
        run_ids: Only these runs (default: every run in the current tenant scope).
        approval_ids: Only these approvals.

    Returns:
        The number of runs failed.
    """
    now = now or timezone.now()
    qs = Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)
    if run_ids is not None:
        qs = qs.filter(run_id__in=run_ids)
    if approval_ids is not None:
        qs = qs.filter(pk__in=approval_ids)
    failed = 0
    for run_id in sorted(set(qs.values_list("run_id", flat=True))):
        run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
        if run.status != RunStatus.AWAITING_APPROVAL:
            continue
        failed += run_finish_unheld(
            run=run, status=RunStatus.FAILED, error=APPROVAL_EXPIRED_ERROR, reason=RunFailureReason.APPROVAL_EXPIRED,
            event_data={"error": APPROVAL_EXPIRED_ERROR, "reason": RunFailureReason.APPROVAL_EXPIRED},
        )
    return failed


# --- sub-runs (skills) -------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class SubRunState:
    """A sub-run as :func:`subrun_open` found or made it."""

    run_id: int
    status: str
    reply: str
    error: str
    created: bool
    attempt: int = 1


async def subrun_open(
    *, parent: RunSpec, call_pk: int, skill_id: int, skill_name: str, task: str, publisher: Callable[[int], Publish],
) -> SubRunState:
    """The sub-run answering tool call ``call_pk`` of run ``parent``: created now (status
    ``running``, the task as its user message), or the existing one (a parent resumed after its
    worker died, or after a human answered an approval inside the sub-run, re-executes the
    call: an active sub-run resumes, ``running``, attempt + 1; an ended one is returned as it
    is).

    Sub-runs have no heartbeat of their own (the parent's covers them) and are never
    touched by the sweeper or the tenant's run limit.

    ``publisher(run_id)``: the sub-run's publisher (the caller's, which adds the parent's ids).

    Emits, after the commit, when the sub-run is running now: ``run_running {attempt, skill,
    depth, task}`` (``skill``: ``skill_name``). Nothing for an ended one.
    """
    state = await db(_subrun_open)(parent=parent, call_pk=call_pk, skill_id=skill_id, task=task)
    if state.status == RunStatus.RUNNING:
        await publisher(state.run_id)("run_running", {"attempt": state.attempt, "skill": skill_name,
                                                      "depth": parent.depth + 1, "task": task})
    return state


@transaction.atomic
def _subrun_open(*, parent: RunSpec, call_pk: int, skill_id: int, task: str) -> SubRunState:
    """:func:`subrun_open`'s transaction."""
    existing = Run.objects.select_for_update(no_key=True).filter(parent_tool_call_id=call_pk).first()
    if existing is not None:
        if existing.status in ACTIVE_RUN_STATUSES:
            existing.status = RunStatus.RUNNING
            existing.attempt += 1
            existing.paused_at = None
            existing.save(update_fields=["status", "attempt", "paused_at"])
        return SubRunState(run_id=existing.pk, status=existing.status, reply=existing.reply, error=existing.error,
                           created=False, attempt=existing.attempt)
    run = Run.objects.create(
        tenant_id=parent.tenant_id, session_id=parent.session_id, user_id=parent.user_id, input=task,
        status=RunStatus.RUNNING, attempt=1, started_at=timezone.now(), parent_tool_call_id=call_pk,
        depth=parent.depth + 1, skill_id=skill_id,
    )
    message_insert(session_id=parent.session_id, run_id=run.pk, role=MessageRole.USER, content=task)
    return SubRunState(run_id=run.pk, status=run.status, reply="", error="", created=True, attempt=1)


async def subrun_pause(*, run_id: int, attempt: int, call_pk: int, publish: Publish) -> bool:
    """Sub-run ``run_id`` waits for a human: ``awaiting_approval``, and so does its parent's
    skill call ``call_pk``. The user's run pauses next (:func:`run_pause`), and when it
    resumes, the skill call is executed again and :func:`subrun_open` resumes this sub-run.

    Emits ``run_awaiting_approval {approvals}`` (the sub-run's own) after the commit.

    Returns:
        False if refused (it ended meanwhile, or a later attempt holds it): nothing written.
    """
    approvals = await db(_subrun_pause)(run_id=run_id, attempt=attempt, call_pk=call_pk)
    if approvals is None:
        return False
    await publish("run_awaiting_approval", {"approvals": approvals})
    return True


@transaction.atomic
def _subrun_pause(*, run_id: int, attempt: int, call_pk: int) -> list[dict[str, Any]] | None:
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    if run.status not in ACTIVE_RUN_STATUSES or run.attempt != attempt:
        return None
    run.status = RunStatus.AWAITING_APPROVAL
    run.paused_at = timezone.now()
    run.save(update_fields=["status", "paused_at"])
    ToolCall.objects.filter(pk=call_pk, finished_at__isnull=True).update(status=ToolCallStatus.AWAITING_APPROVAL)
    pending = Approval.objects.filter(sub_run_id=run_id, status=ApprovalStatus.PENDING).select_related("sub_run__skill")
    return [approval_payload(a) for a in pending.order_by("id")]


async def subrun_finish(run_id: int, ending: RunEnding, *, publish: Publish, attempt: int | None = None) -> bool:
    """End sub-run ``run_id`` (:func:`run_end`) and add its tokens and cost to its parent run.

    ``attempt``: the attempt the caller holds; if the sub-run was resumed since (its parent
    was taken over by another worker), the transition is refused.

    Emits the end event (:func:`end_event`) through ``publish`` after the commit.

    Returns:
        False if refused (already ended, or a later attempt holds it): nothing written or
        published.
    """
    recorded = await db(_subrun_end)(run_id=run_id, status=ending.status, reply=ending.reply, error=ending.error,
                                     reason=ending.reason, attempt=attempt)
    if recorded:
        await publish(*end_event(ending))
    return recorded


@transaction.atomic
def _subrun_end(
    *, run_id: int, status: str, reply: str = "", error: str = "", reason: str = "", attempt: int | None = None,
) -> bool:
    """:func:`subrun_finish`'s transaction. The parent's totals then include everything done on
    its behalf (the session's usage counts only user runs; LLMCall rows keep the per-call
    truth)."""
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    if run.status not in ACTIVE_RUN_STATUSES or (attempt is not None and run.attempt != attempt):
        return False
    run_end(run_id=run_id, status=status, reply=reply, error=error, reason=reason)
    parent_run_id = ToolCall.objects.values_list("run_id", flat=True).get(pk=run.parent_tool_call_id)
    Run.objects.filter(pk=parent_run_id).update(
        prompt_tokens=F("prompt_tokens") + run.prompt_tokens,
        completion_tokens=F("completion_tokens") + run.completion_tokens,
        cost_usd_micros=F("cost_usd_micros") + run.cost_usd_micros,
    )
    return True
