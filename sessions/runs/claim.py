"""Who may start, and the claim: queued | running (stale) → running.

A run starts when a worker claims it (:func:`run_claim`): at most one run of a session is
active at a time, a tenant has at most its limit of runs working
(:func:`tenant_run_limit`, :func:`tenant_waiting_run_ids`), and a ``running`` run belongs to the
worker whose heartbeat (:func:`run_heartbeat`) is fresh (:func:`stale_before`). The runs that
may start once another ended are found here and handed to workers by the transitions that free
their slot (:mod:`sessions.runs.handoff`).

Every function expects the caller's tenant scope and filters by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from sessions.events import event_publish
from sessions.models import ACTIVE_RUN_STATUSES, Run, RunStatus
from sessions.runner.pg import pg_connection
from sessions.runner.threads import db
from sessions.runs import statements as sql
from tenants.scoping import require_tenant_id

T = TypeVar("T")


def next_queued_run_id(*, session_id: int) -> int | None:
    """The session's next queued run (the lowest id), or None."""
    with connection.cursor() as cursor:
        cursor.execute(sql.NEXT_QUEUED_SQL, {"session_id": session_id, "tenant_id": require_tenant_id(),
                                             "queued": RunStatus.QUEUED.value})
        row = cursor.fetchone()
    return row[0] if row else None


def stale_before() -> datetime:
    """Heartbeats older than this are a dead worker's (now − ``RUN_STALE_SECONDS``)."""
    return timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS)


def tenant_run_limit(max_concurrent_runs: int | None) -> int:
    """A tenant's limit on working runs: its own (``Tenant.max_concurrent_runs``), else
    ``RUNS_PER_TENANT_DEFAULT``."""
    return max_concurrent_runs if max_concurrent_runs is not None else settings.RUNS_PER_TENANT_DEFAULT


def tenant_waiting_run_ids(tenant_id: int) -> list[int]:
    """The tenant's held-back runs that may start now (claims refused for the tenant's limit,
    ``Run.held_back``): first in their session, oldest first, at most as many as the tenant
    has free slots. Each is marked handed (no longer held) as it is returned, so the next run
    to end does not hand it again while its task is on its way; a claim refused again marks it
    again. Runs whose first claim has not happened yet (their task still in the broker or
    waiting for a worker thread) are not among them: handing them again was most of the run
    tasks at 600 runs at once (bench/README.md, ``scale_out.py``).

    Takes the tenant's row lock (as the claim does) in its own transaction, or in the
    caller's: after the claims that held it first committed their marks.

    Returns:
        Run ids, ascending.
    """
    params = {"tenant_id": tenant_id, "queued": RunStatus.QUEUED.value, "running": RunStatus.RUNNING.value,
              "active": [str(s) for s in ACTIVE_RUN_STATUSES], "stale_before": stale_before()}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_LOCK_TENANT_SQL, params)
        row = cursor.fetchone()
        if row is None:
            return []
        params["limit"] = tenant_run_limit(row[1])
        cursor.execute(sql.TENANT_HELD_HAND_SQL, params)
        return sorted(r[0] for r in cursor.fetchall())


# --- the claim ----------------------------------------------------------------------------


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
    started_at: datetime | None
    paused_seconds: float
    request_options: dict[str, Any] | None = None
    """``Run.request_options`` (the API caller's client tools, instructions, response format)."""
    agent_version_id: int | None = None
    """``Run.agent_version``: the agent's version the run runs (None: a run from before versions)."""
    purpose: str = "chat"
    """``Run.purpose``: where the run came from (:class:`sessions.models.RunPurpose`)."""

    @classmethod
    def of(cls, run: Run) -> ClaimedRun:
        """The same columns from a Run row (its session's agent included)."""
        return cls(
            pk=run.pk, tenant_id=run.tenant_id, session_id=run.session_id, user_id=run.user_id,
            agent_id=run.session.agent_id, attempt=run.attempt, loop_count=run.loop_count,
            started_at=run.started_at, paused_seconds=run.paused_seconds, request_options=run.request_options,
            agent_version_id=run.agent_version_id, purpose=run.purpose,
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


def _claim(run_id: int) -> ClaimedRun:
    """The claim's transaction (see :func:`run_claim`): lock the session, then the run; check
    it may start; last, for a queued run, lock the tenant and count its working runs; mark it
    running. Plain SQL: the ORM's version was most of a claim's CPU (bench/README.md).

    A refusal for the tenant's limit commits the run's held-back mark before it is raised."""
    outcome = _claim_or_hold(run_id)
    if isinstance(outcome, RunNotClaimable):
        raise outcome
    return outcome


@transaction.atomic
def _claim_or_hold(run_id: int) -> ClaimedRun | RunNotClaimable:
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
        (status, heartbeat_at, steered_into_id, user_id, loop_count, paused_seconds, options, version_id,
         purpose) = cursor.fetchone()
        _check_claimable(run_id, status, heartbeat_at, steered_into_id)
        cursor.execute(sql.CLAIM_EARLIER_ACTIVE_SQL, {**params, "active": [str(s) for s in ACTIVE_RUN_STATUSES]})
        if cursor.fetchone()[0]:
            raise RunNotClaimable(f"run {run_id} waits for an earlier run of its session")
        params.update(running=RunStatus.RUNNING.value, now=timezone.now())
        if status == RunStatus.QUEUED and (refused := _tenant_slot_refusal(cursor, run_id, params)):
            return refused
        cursor.execute(sql.CLAIM_UPDATE_SQL, params)
        attempt, started_at = cursor.fetchone()
    return ClaimedRun(
        pk=run_id, tenant_id=params["tenant_id"], session_id=params["session_id"], user_id=user_id,
        agent_id=agent_id, attempt=attempt, loop_count=loop_count, started_at=started_at,
        paused_seconds=paused_seconds, request_options=options, agent_version_id=version_id, purpose=purpose,
    )


def _check_claimable(run_id: int, status: str, heartbeat_at: datetime | None, steered_into_id: int | None) -> None:
    if status not in (RunStatus.QUEUED, RunStatus.RUNNING):
        raise RunNotClaimable(f"run {run_id} is {status}")
    if status == RunStatus.RUNNING and heartbeat_at is not None and heartbeat_at > stale_before():
        raise RunNotClaimable(f"run {run_id} is held by a live worker (heartbeat {heartbeat_at.isoformat()})")
    if steered_into_id is not None:
        raise RunNotClaimable(f"run {run_id} was handed to run {steered_into_id}")


def _tenant_slot_refusal(cursor: CursorWrapper, run_id: int, params: dict[str, Any]) -> RunNotClaimable | None:
    """Last before the commit: the tenant's claims queue on this lock, so hold it briefly. At
    the limit, the run is marked held back (committed with the refusal: the caller returns,
    not raises) and the refusal returned."""
    cursor.execute(sql.CLAIM_LOCK_TENANT_SQL, params)
    slug, max_concurrent_runs = cursor.fetchone()
    limit = tenant_run_limit(max_concurrent_runs)
    cursor.execute(sql.CLAIM_WORKING_SQL, {**params, "stale_before": stale_before()})
    working = cursor.fetchone()[0]
    if working < limit:
        return None
    cursor.execute(sql.CLAIM_HOLD_SQL, params)
    return RunNotClaimable(f"run {run_id} waits: tenant {slug} has {working} of {limit} runs working")


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

