"""A user's cancel of a run: queued → cancelled at once; awaiting approval (no worker holds
it) → ended cancelled here; running → the cancel signal, and its worker records the end.

The signal itself (a Redis key and a pub/sub message the worker watches) is
:mod:`sessions.runner.cancellation`; the end of a run no worker holds is
:func:`sessions.runs.ending.run_finish_unheld`. Requires the caller's tenant scope.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from sessions.events import event_publish_on_commit
from sessions.models import ACTIVE_RUN_STATUSES, Run, RunStatus, ToolCall
from sessions.runner.cancellation import CANCEL_ERROR, CANCEL_REASON, request_cancel_sync
from sessions.runs.claim import next_queued_run_id
from sessions.runs.ending import run_finish_unheld
from sessions.runs.handoff import run_enqueue_on_commit
from sessions.runs.subruns import subrun_end
from sessions.runs.transitions import run_resume


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
    subrun_end(run_id=run.pk, status=RunStatus.CANCELLED, error=CANCEL_ERROR)
    parent_run_id = ToolCall.objects.values_list("run_id", flat=True).get(pk=run.parent_tool_call_id)
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="run_cancelled", data={
        "reason": CANCEL_REASON, "parent_run_id": parent_run_id, "parent_tool_call_id": run.parent_tool_call_id,
    })
    run_resume(run=user_run, now=timezone.now())
