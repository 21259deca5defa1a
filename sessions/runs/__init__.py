"""The run lifecycle: every write of a Run, and of the rows a run writes (its messages, tool
calls, LLM calls, compactions, approvals), is one named function of this package. The API
services (:mod:`sessions.services`), the sweeper and the runner (:mod:`sessions.runner`) all
call these; nothing else writes ``Run.status`` (``sessions/tests/test_run_lifecycle.py``
checks the source).

Status transitions (each publishes its event after its commit), one module per concern:
:mod:`~sessions.runs.transitions` (create, steer, pause, resume), :mod:`~sessions.runs.claim`
(the claim, the heartbeat, who may start), :mod:`~sessions.runs.ending` (the end),
:mod:`~sessions.runs.cancellation` (a user's cancel), :mod:`~sessions.runs.approvals` (decisions
and expiry), :mod:`~sessions.runs.subruns` (a skill's sub-run):

===========================  ===========================================  ============================  =====================
function                     transition                                   event                         caller
===========================  ===========================================  ============================  =====================
``run_create``               (new) → queued                               ``run_queued {input}``        ``message_post``
``run_claim``                queued | running (stale) → running           ``run_running {attempt}``     runner
``steer_absorb``             queued (steer) → running (``steered_into``)  ``run_running {steered_into}`` runner
``run_pause``                running → awaiting_approval (or → queued)    ``run_awaiting_approval``     runner
``run_resume``               awaiting_approval → queued                   ``run_queued {resumed}``      ``approval_decide``, sub-run cancel
``run_finish``               running → completed | failed | cancelled     ``run_completed`` / ``_failed`` / ``_cancelled``  runner
``run_finish_unheld``        awaiting_approval | running (orphan) → failed | cancelled   ``run_failed`` / ``run_cancelled``  ``run_cancel``, ``approvals_expire``, sweeper
``run_cancel``               queued → cancelled; running: cancel signal   ``run_cancelled``             API
``subrun_open``              (new) → running; active → running (resume)   ``run_running {skill, task}``  skill tool
``subrun_pause``             running → awaiting_approval                  ``run_awaiting_approval``     skill tool
``subrun_finish``            running → completed | failed | cancelled     the end event                 skill tool
===========================  ===========================================  ============================  =====================

A transition the run's status does not allow is refused and says so (False, ``None``,
``RunFinished.ended`` False, :class:`RunNotClaimable`, a 409 ``ApplicationError``), writing and
publishing nothing. ``run_end`` is the one place a run's end is written (``run_finish``,
``run_finish_unheld`` and ``subrun_finish`` call it; ``run_finish``'s plain-SQL fast path runs
the same statements pipelined on the loop's connection).

Runs that may start are handed to workers through a port, :mod:`sessions.runs.handoff`
(``run_enqueue_on_commit``, ``runs_hand_to_workers``): the Celery senders of
:mod:`sessions.tasks` are registered by :meth:`sessions.apps.AgentSessionsConfig.ready`, so
this package never imports the tasks (they import the runner, which imports this package).

Row writes (:mod:`sessions.runs.records`): ``message_insert``, ``assistant_message_save`` (a
model turn: message, tool calls, LLM call, usage), ``tool_call_start``, ``tool_call_finish``,
``llm_call_record``, ``compaction_begin`` / ``compaction_save``, ``approval_request``. The
statements every turn makes are plain SQL (:mod:`sessions.runs.statements`) on the run host loop's
async connection. Those clients see publish their own event after their commit, through the
run's ``publish`` (``tool_call_started``, ``tool_call_succeeded`` / ``tool_call_failed``,
``compaction_running``, ``compaction_completed``); no other module publishes these
(``sessions/tests/test_run_lifecycle.py`` checks the source).
"""

from sessions.runs.approvals import (
    APPROVAL_EXPIRED_ERROR,
    approval_decide,
    approvals_expire,
    client_tool_outputs_submit,
)
from sessions.runs.cancellation import run_cancel
from sessions.runs.claim import (
    ClaimedRun,
    RunNotClaimable,
    next_queued_run_id,
    run_claim,
    run_heartbeat,
    stale_before,
    tenant_run_limit,
    tenant_waiting_run_ids,
)
from sessions.runs.ending import RunEnding, RunFinished, end_event, run_end, run_finish, run_finish_unheld
from sessions.runs.handoff import (
    WorkerHandOff,
    chat_title_hand_off,
    run_enqueue_on_commit,
    run_hand_off,
    runs_hand_to_workers,
    workers_register,
)
from sessions.runs.records import (
    Publish,
    approval_payload,
    approval_request,
    assistant_message_save,
    compaction_begin,
    compaction_completed_event,
    compaction_save,
    llm_call_record,
    message_insert,
    tool_call_finish,
    tool_call_finished_event,
    tool_call_start,
)
from sessions.runs.subruns import SubRunState, session_handoff, subrun_finish, subrun_open, subrun_pause
from sessions.runs.transitions import run_create, run_pause, run_purpose, run_resume, steer_absorb

__all__ = [
    "APPROVAL_EXPIRED_ERROR", "ClaimedRun", "Publish", "RunEnding", "RunFinished", "RunNotClaimable", "SubRunState",
    "WorkerHandOff", "approval_decide", "approval_payload", "approval_request", "approvals_expire",
    "assistant_message_save", "chat_title_hand_off", "client_tool_outputs_submit", "compaction_begin", "compaction_completed_event",
    "compaction_save", "end_event", "llm_call_record", "message_insert", "next_queued_run_id", "run_cancel",
    "run_claim", "run_create", "run_purpose", "run_end", "run_enqueue_on_commit", "run_finish", "run_finish_unheld",
    "run_hand_off", "run_heartbeat", "run_pause", "run_resume", "runs_hand_to_workers", "stale_before",
    "session_handoff", "steer_absorb", "subrun_finish", "subrun_open", "subrun_pause", "tenant_run_limit", "tenant_waiting_run_ids",
    "tool_call_finish", "tool_call_finished_event", "tool_call_start", "workers_register",
]
