"""A run's transitions before its end: created (→ queued), steered into a running run,
paused for a human (running → awaiting_approval) and resumed (→ queued).

The claim (queued → running) is :mod:`sessions.runs.claim`, the end :mod:`sessions.runs.ending`,
a user's cancel :mod:`sessions.runs.cancellation`, a decision on an approval
:mod:`sessions.runs.approvals`, a skill's sub-run :mod:`sessions.runs.subruns`. Each function
publishes its event after its commit (on commit for a caller's transaction, through the run's
``publish`` for the runner) and hands the runs that may now start to workers
(:mod:`sessions.runs.handoff`). Every function expects the caller's tenant scope.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from agents.versions import run_version_for
from sessions.events import event_publish_on_commit
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalStatus,
    ChatSession,
    Message,
    MessageRole,
    Run,
    RunPurpose,
    RunStatus,
    TaskPushConfig,
)
from sessions.runner.threads import db
from sessions.runs.claim import tenant_waiting_run_ids
from sessions.runs.handoff import run_enqueue_on_commit, runs_hand_to_workers
from sessions.runs.records import Publish, approval_payload, run_event_observe, run_event_observers, run_event_wanted
from tenants.scoping import require_tenant_id

_unattended: contextvars.ContextVar[bool] = contextvars.ContextVar("unattended_runs", default=False)
_purpose: contextvars.ContextVar[str] = contextvars.ContextVar("run_purpose", default=RunPurpose.CHAT)


@contextlib.contextmanager
def run_purpose(purpose: str) -> Iterator[None]:
    """Runs created inside (:func:`run_create`) record ``purpose`` (a :class:`RunPurpose`
    value: ``Run.purpose``, shown in the console and the usage breakdown). Default ``chat``;
    :func:`unattended_runs` sets ``api``; evaluation and automations set theirs."""
    token = _purpose.set(RunPurpose(purpose))
    try:
        yield
    finally:
        _purpose.reset(token)


@contextlib.contextmanager
def unattended_runs() -> Iterator[None]:
    """Runs created inside (:func:`run_create`) have nobody watching them (the OpenAI-compatible
    API, A2A, agents over MCP): their ``request_options`` get ``unattended`` = the setting
    ``MCP_ELICITATION_UNATTENDED_ANSWER`` (``decline`` by default), the answer an MCP server's
    request for input gets at once (:class:`sessions.runner.spec.RunRequestOptions`), and
    their ``purpose`` is ``api`` (:func:`run_purpose`)."""
    token, purpose_token = _unattended.set(True), _purpose.set(RunPurpose.API)
    try:
        yield
    finally:
        _purpose.reset(purpose_token)
        _unattended.reset(token)


def run_create(*, session: ChatSession, user: AbstractBaseUser, content: str,
               request_options: dict[str, Any] | None = None) -> Run:
    """A new run (``queued``) answering ``content``, the user's message written with it
    (``request_options``: what an API caller asked of it, ``Run.request_options``).

    ``session`` must be locked by the caller (``select_for_update``) inside its transaction;
    its next message position is taken and saved (with any ``title`` the caller set on it).
    If the agent is in ``steer`` mode and a run of the session is active, the run is marked
    ``steer`` (the running run may absorb it, :func:`steer_absorb`).

    The run's agent version is resolved here, once (:func:`agents.versions.run_version_for`:
    the published one, or what the caller pinned, ``slug@n`` or the playground's draft).

    Raises:
        agents.versions.VersionError: a pinned version the agent does not have.

    Emits ``run_queued {input}`` on commit and hands the run to a worker on commit.
    """
    steer = session.agent.message_mode == "steer" and Run.objects.filter(
        session=session, status__in=ACTIVE_RUN_STATUSES
    ).exists()
    if _unattended.get():
        from django.conf import settings

        answer = getattr(settings, "MCP_ELICITATION_UNATTENDED_ANSWER", "decline")
        request_options = {**(request_options or {}), "unattended": answer if answer == "cancel" else "decline"}
    run = Run.objects.create(tenant_id=session.tenant_id, session=session, user=user, input=content, steer=steer,
                             request_options=request_options, agent_version_id=run_version_for(session.agent),
                             purpose=_purpose.get())
    Message.objects.create(
        tenant_id=session.tenant_id, session=session, run=run, role=MessageRole.USER,
        content=content, position=session.next_position,
    )
    session.next_position += 1
    session.save(update_fields=["next_position", "title", "updated_at"])
    event_publish_on_commit(session_id=session.pk, run_id=run.pk, type="run_queued", data={"input": content})
    run_enqueue_on_commit(run_id=run.pk)
    return run


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

    Emits ``run_awaiting_approval {approvals}`` after the commit when it paused, once the run
    event observers have heard of the pause (so the A2A push notifications of the pause go to
    the task's configs as they were when it paused: a config a client sets after it saw the
    pause gets the next state change, not this one).

    Returns:
        Whether the run paused (False: it was queued again at once).
    """
    approvals, to_start, push_configured = await db(_pause)(run_id)
    if approvals:
        tenant_id = require_tenant_id()
        if run_event_observers and run_event_wanted(tenant_id, "run_awaiting_approval", push_configured=push_configured):
            await db(run_event_observe)(tenant_id, run_id, "run_awaiting_approval", {"approvals": approvals})
        await publish("run_awaiting_approval", {"approvals": approvals})
    await runs_hand_to_workers(to_start)
    return bool(approvals)


@transaction.atomic
def _pause(run_id: int) -> tuple[list[dict[str, Any]], list[int], bool]:
    """:func:`run_pause`'s transaction: (the pending approvals as event payloads, run ids to
    hand to workers, whether the run has an A2A push-notification config)."""
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    pending = list(
        Approval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).select_related("sub_run__skill")
        .order_by("id")
    )
    if not pending:
        run.status = RunStatus.QUEUED
        run.heartbeat_at = None
        run.save(update_fields=["status", "heartbeat_at"])
        return [], [run_id], False
    run.status = RunStatus.AWAITING_APPROVAL
    run.paused_at = timezone.now()
    run.heartbeat_at = None
    run.save(update_fields=["status", "paused_at", "heartbeat_at"])
    Run.objects.filter(steered_into_id=run_id).update(status=RunStatus.AWAITING_APPROVAL)
    push_configured = TaskPushConfig.objects.filter(run_id=run_id).exists()
    return [approval_payload(a) for a in pending], tenant_waiting_run_ids(run.tenant_id), push_configured


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

