"""Writes for sessions and runs."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from sessions.events import event_publish_on_commit
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Artifact,
    ChatSession,
    Message,
    MessageRole,
    Run,
    RunFailureReason,
    RunStatus,
    ToolCall,
)
from tenants.audit import Action, audit_record
from tenants.scoping import current_tenant_id

MAX_MESSAGE_CHARS = 100_000


@transaction.atomic
def chat_session_create(*, user: AbstractBaseUser, agent: AgentInstance, title: str = "") -> ChatSession:
    """Open a session with ``agent`` for ``user`` in the agent's tenant."""
    if not agent.is_active:
        raise ApplicationError("This agent is not active.")
    session = ChatSession(tenant_id=agent.tenant_id, agent=agent, user=user, title=title[:200])
    session.full_clean()
    session.save()
    return session


def run_enqueue_on_commit(*, run_id: int) -> None:
    """Hand the run to a worker once the transaction commits (with the tenant in context, if
    one: callers work in the run's tenant)."""
    from sessions.tasks import run_enqueue

    tenant_id = current_tenant_id()
    transaction.on_commit(lambda: run_enqueue(run_id, tenant_id))


@transaction.atomic
def message_post(*, session: ChatSession, user: AbstractBaseUser, content: str) -> Run:
    """Post a user message: records it, creates a queued Run, and queues the run.

    Messages posted while another run of the session is active queue behind it and run next,
    in order (the worker that finishes a run starts the next queued one). If the agent's
    ``message_mode`` is ``steer``, such a run is marked ``steer``: the running run takes its
    message in at its next model turn (``steered_into``) and it ends as that run ends; if
    the running run ends first, it runs on its own like a queued one.

    Raises:
        ApplicationError: empty or over-long content.

    Emits ``run_queued`` on commit.
    """
    content = content.strip()
    if not content:
        raise ApplicationError("The message is empty.")
    if len(content) > MAX_MESSAGE_CHARS:
        raise ApplicationError(f"The message is longer than {MAX_MESSAGE_CHARS} characters.")
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    steer = session.agent.message_mode == "steer" and Run.objects.filter(
        session=session, status__in=ACTIVE_RUN_STATUSES
    ).exists()
    run = Run.objects.create(tenant_id=session.tenant_id, session=session, user=user, input=content, steer=steer)
    Message.objects.create(
        tenant_id=session.tenant_id, session=session, run=run, role=MessageRole.USER,
        content=content, position=session.next_position,
    )
    session.next_position += 1
    if not session.title:
        from sessions.chat_services import chat_title_from  # (it imports this module)

        session.title = chat_title_from(content)[:200]
    session.save(update_fields=["next_position", "title", "updated_at"])
    event_publish_on_commit(session_id=session.pk, run_id=run.pk, type="run_queued", data={"input": content})
    run_enqueue_on_commit(run_id=run.pk)
    return run


def run_end_unheld(*, run: Run, status: str, error: str, reason: str = "", event_data: dict) -> None:
    """End a run no worker holds (awaiting approval): record it, publish its end (and that of
    runs steered into it) on commit, and hand the runs that may now start to workers."""
    from sessions.runner._db import run_finish

    event_type = {RunStatus.CANCELLED: "run_cancelled", RunStatus.FAILED: "run_failed"}[status]
    finished = run_finish(run_id=run.pk, status=status, error=error, reason=reason)
    for steered_id in finished.steered:
        event_publish_on_commit(session_id=run.session_id, run_id=steered_id, type=event_type,
                                data={**event_data, "steered_into": run.pk})
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type=event_type, data=event_data)
    for run_id in finished.to_start:
        run_enqueue_on_commit(run_id=run_id)


def next_queued_run_id(*, session_id: int) -> int | None:
    return (
        Run.objects.filter(session_id=session_id, status=RunStatus.QUEUED)
        .order_by("pk").values_list("pk", flat=True).first()
    )


@transaction.atomic
def run_cancel(*, run: Run) -> Run:
    """Cancel ``run``: at once if it is queued, through its worker if it is running.

    - ``queued``: marked ``cancelled`` here (error "Cancelled by the user.", ``reason`` "")
      under ``select_for_update`` of the run; ``run_claim`` then refuses it. If no run of the
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

    Requires tenant scope. Emits ``run_cancelled`` ``{reason}`` on commit for a queued run
    (the worker emits it for a running one).
    """
    from django.utils import timezone

    from sessions.runner.cancellation import CANCEL_ERROR, CANCEL_REASON, request_cancel_sync

    user_run = None
    if run.parent_tool_call_id is not None:  # lock order: the user's run, then its sub-run (as run_finish)
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
        run_end_unheld(run=run, status=RunStatus.CANCELLED, error=CANCEL_ERROR, event_data={"reason": CANCEL_REASON})
        run.refresh_from_db()
        return run
    if run.status == RunStatus.QUEUED:
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
    run_id = run.pk
    transaction.on_commit(lambda: request_cancel_sync(run_id))
    return run


MAX_ARTIFACT_BYTES = 20 * 1024 * 1024
"""Largest artifact stored (20 MiB); bigger outputs are cut to this."""


def artifact_create(
    *, tenant_id: int, session_id: int, name: str, mime_type: str, data: bytes,
    run_id: int | None = None, tool_call_id: int | None = None,
) -> Artifact:
    """Store ``data`` (≤ :data:`MAX_ARTIFACT_BYTES`, cut beyond) as an artifact of the session.

    Returns the saved Artifact. The caller publishes ``artifact_updated`` if a client should
    hear of it (:meth:`capabilities.tools.ToolContext.artifact_save` does).
    """
    data = bytes(data[:MAX_ARTIFACT_BYTES])
    return Artifact.objects.create(
        tenant_id=tenant_id, session_id=session_id, run_id=run_id, tool_call_id=tool_call_id,
        name=(name or "artifact")[:200], mime_type=(mime_type or "application/octet-stream")[:100],
        size_bytes=len(data), content=data,
    )


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
        (``paused_seconds`` grows by the wait) and handed to any worker on commit.

    Raises:
        ApplicationError: 400 for a missing/invalid decision or answer; 409 when the approval
            was already decided, has expired (the run then fails ``approval_expired``) or its
            run is no longer waiting.

    Emits ``approval_resolved`` ``{approval_id, tool_call_id, status}`` on commit.
    """
    from django.utils import timezone

    with transaction.atomic():  # committed before the caller gets its 409
        expired = approvals_expire(run_ids=[approval.run_id], approval_ids=[approval.pk])
    if expired:
        raise ApplicationError("This approval has expired; the run has failed.", status_code=409)
    return _approval_decide(approval=approval, user=user, decision=decision, reason=reason, answer=answer,
                            now=timezone.now())


@transaction.atomic
def _approval_decide(*, approval: Approval, user: AbstractBaseUser, decision: str, reason: str, answer: str,
                     now) -> Approval:
    run = Run.objects.select_for_update(no_key=True).get(pk=approval.run_id)
    approval = Approval.objects.select_for_update(no_key=True).get(pk=approval.pk)
    if approval.kind == ApprovalKind.QUESTION:
        answer = (answer or "").strip()
        if not answer:
            raise ApplicationError("Send the answer to the question in `answer`.")
        if len(answer) > 10_000:
            raise ApplicationError("The answer is longer than 10000 characters.")
    elif decision not in ("approve", "deny"):
        raise ApplicationError("`decision` must be 'approve' or 'deny'.")
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
    _run_resume_if_decided(run=run, now=now)
    return approval


def _run_resume_if_decided(*, run: Run, now) -> bool:
    """Queue paused user's run ``run`` (locked by the caller) again if none of its approvals
    (its sub-runs' included) is pending; hand it to a worker on commit. Returns whether it was."""
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
    expire); ``user_run`` (locked before ``run``, the order :func:`run_finish` locks in) resumes
    if nothing else is pending, executes the skill call again and hears that the skill was
    cancelled."""
    from django.utils import timezone

    from sessions.runner._db import subrun_finish
    from sessions.runner.cancellation import CANCEL_ERROR, CANCEL_REASON

    subrun_finish(run_id=run.pk, status=RunStatus.CANCELLED, error=CANCEL_ERROR)
    parent_run_id = ToolCall.objects.values_list("run_id", flat=True).get(pk=run.parent_tool_call_id)
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="run_cancelled", data={
        "reason": CANCEL_REASON, "parent_run_id": parent_run_id, "parent_tool_call_id": run.parent_tool_call_id,
    })
    _run_resume_if_decided(run=user_run, now=timezone.now())


def approvals_expire(*, now=None, run_ids: list[int] | None = None, approval_ids: list[int] | None = None) -> int:
    """Expire pending approvals past ``expires_at``; their runs fail with ``approval_expired``.

    Args:
        now: The time to compare with (default: now).
        run_ids: Only these runs (default: every run in the current tenant scope).
        approval_ids: Only these approvals.

    Returns:
        The number of runs failed.
    """
    from django.utils import timezone

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
        error = "Nobody answered the approval request in time."
        run_end_unheld(run=run, status=RunStatus.FAILED, error=error, reason=RunFailureReason.APPROVAL_EXPIRED,
                       event_data={"error": error, "reason": RunFailureReason.APPROVAL_EXPIRED})
        failed += 1
    return failed


QUEUED_RESEND_SECONDS = 300.0
"""A run first in its session's queue for this long is handed to a worker again (its task may
have been lost with a broker that forgot it); duplicates are harmless, the claim decides."""


def runs_sweep() -> dict[str, int]:
    """Find runs nobody is working on and act (Celery beat, every RUN_SWEEP_INTERVAL_SECONDS).

    - ``running`` runs whose heartbeat is older than ``RUN_STALE_SECONDS`` (their worker
      died): handed to a worker again to resume from what they persisted, or, after
      ``RUN_MAX_ATTEMPTS`` starts, failed with reason ``worker_lost``;
    - pending approvals past their expiry: their runs fail with ``approval_expired``;
    - queued runs first in their session for over :data:`QUEUED_RESEND_SECONDS`: handed to a
      worker again.

    Works across tenants (each run handled in its own tenant scope).

    Returns:
        Counts: ``{"resumed", "worker_lost", "approvals_expired", "resent"}``.
    """
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from sessions.runner._db import stale_before
    from tenants.scoping import system_scope, tenant_scope

    counts = {"resumed": 0, "worker_lost": 0, "approvals_expired": 0, "resent": 0}
    stale = stale_before()
    # tenant-bypass: the sweeper looks at every tenant's runs, then works inside each run's tenant.
    # Sub-runs are left out: they live inside their parent's tool call, which resumes them.
    with system_scope():
        orphans = list(Run.all_tenants.filter(status=RunStatus.RUNNING, steered_into__isnull=True,
                                              parent_tool_call__isnull=True).filter(
            models.Q(heartbeat_at__lt=stale) | models.Q(heartbeat_at__isnull=True, started_at__lt=stale)
        ).values_list("pk", "tenant_id", "attempt"))
    for run_id, tenant_id, attempt in orphans:
        with tenant_scope(tenant_id), transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
            if run.status != RunStatus.RUNNING or (run.heartbeat_at is not None and run.heartbeat_at >= stale):
                continue
            if attempt >= settings.RUN_MAX_ATTEMPTS:
                error = f"The worker running this run stopped {attempt} times; giving up."
                run_end_unheld(run=run, status=RunStatus.FAILED, error=error, reason=RunFailureReason.WORKER_LOST,
                               event_data={"error": error, "reason": RunFailureReason.WORKER_LOST})
                counts["worker_lost"] += 1
            else:
                run_enqueue_on_commit(run_id=run.pk)
                counts["resumed"] += 1
    # tenant-bypass: as above, for expired approvals.
    with system_scope():
        expired = Approval.all_tenants.filter(status=ApprovalStatus.PENDING, expires_at__lte=timezone.now())
        expired_tenants = set(expired.values_list("tenant_id", flat=True))
    for tenant_id in expired_tenants:
        with tenant_scope(tenant_id), transaction.atomic():
            counts["approvals_expired"] += approvals_expire()
    old = timezone.now() - timedelta(seconds=QUEUED_RESEND_SECONDS)
    earlier_active = Run.all_tenants.filter(  # tenant-bypass: same session, hence same tenant
        session_id=models.OuterRef("session_id"), pk__lt=models.OuterRef("pk"), status__in=ACTIVE_RUN_STATUSES
    )
    # tenant-bypass: queued runs of every tenant, re-sent by id only.
    with system_scope():
        waiting = list(
            Run.all_tenants.filter(status=RunStatus.QUEUED, steered_into__isnull=True, created_at__lt=old)
            .exclude(models.Exists(earlier_active)).order_by("pk").values_list("pk", flat=True)[:100]
        )
    for run_id in waiting:
        from sessions.tasks import run_enqueue

        run_enqueue(run_id)
        counts["resent"] += 1
    return counts
