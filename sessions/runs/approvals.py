"""Approvals: a human's decision on a pending approval (the run resumes once none is
pending, :func:`sessions.runs.transitions.run_resume`), and the expiry of those nobody
answered in time (the run fails ``approval_expired``, :func:`sessions.runs.ending.run_finish_unheld`).

An approval is requested by the runner (:func:`sessions.runs.records.approval_request`); the
run's pause announces it (:func:`sessions.runs.transitions.run_pause`). Requires the caller's
tenant scope.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from capabilities.mcp.elicitation import ACTIONS as ELICITATION_ACTIONS
from capabilities.mcp.elicitation import content_errors
from sessions.events import event_publish_on_commit
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalKind,
    ApprovalOnTimeout,
    ApprovalStatus,
    Run,
    RunFailureReason,
    RunStatus,
)
from sessions.runs.ending import run_finish_unheld
from sessions.runs.records import run_event_observe, run_event_observers
from sessions.runs.transitions import run_resume
from sessions.selectors import approval_may_decide, member_role
from tenants.audit import Action, audit_record


def approval_decide(*, approval: Approval, user: AbstractBaseUser, decision: str = "", reason: str = "",
                    answer: str = "", action: str = "", content: Any = None) -> Approval:
    """Record a human's decision on a pending approval; resume the run once none is pending.

    Args:
        approval: A tool-call approval (of the caller's run, or one the caller is an approver
            of) or an ``ask_user`` question of the caller's run.
        user: Who decides; must be one of the approval's approvers.
        decision: ``approve`` or ``deny`` (tool-call approvals, and kind ``sampling``: an MCP
            server's use of the agent's model). Kind ``connection`` (an OAuth MCP server's
            account to connect): ``deny`` goes on without it; ``approve`` says it is connected
            now (a 409 when it is not; connecting answers it on its own,
            :func:`connection_approvals_answer`).
        reason: Optional, why (≤ 2,000 characters): a denial's is fed back to the model with
            the failed call (kind ``sampling``: in the error the server or the model reads);
            either is kept in the audit log and on the run's trace.
        answer: The answer to a question (required, ≤ 10,000 characters).
        action: Kind ``elicitation``: ``accept``, ``decline`` or ``cancel``.
        content: Kind ``elicitation`` accepted in form mode: the form's values, checked against
            the server's requested schema (:func:`capabilities.mcp.elicitation.content_errors`).

    Returns:
        The approval as stored. When the run has no pending approval left it is queued again
        (:func:`run_resume`).

    Raises:
        ApplicationError: 403 when ``user`` is not one of the approval's approvers
            (:func:`sessions.selectors.approval_may_decide`; the message names who may decide);
            400 for a missing/invalid decision, answer, action or content (an
            invalid field: ``extra={"errors": {field: reason}}``, the message names it); 409 when the approval
            was already decided, has expired (the run then fails ``approval_expired``, or the
            rule's ``on_timeout`` decided it) or its run is no longer waiting.

    Emits ``approval_resolved`` ``{approval_id, tool_call_id, status, sub_run_id}`` on commit,
    and tells the run-event observers (``approval_resolved``: outbound webhooks'
    ``approval.decided``). The audit log gets the decision, the decider and, for a tool call
    or a sampling request, the reason given.
    """
    if not approval_may_decide(approval, user_id=user.pk, role=member_role(user_id=user.pk)):
        raise ApplicationError(f"Only the approvers may decide this approval: {approvers_text(approval)}.",
                               status_code=403, extra={"approvers": approval.approvers or {}})
    with transaction.atomic():  # committed before the caller gets its 409
        expired = approvals_expire(run_ids=[approval.run_id], approval_ids=[approval.pk])
    if expired:
        raise ApplicationError("This approval has expired; the run has failed.", status_code=409)
    return _approval_decide(approval=approval, user=user, decision=decision, reason=reason, answer=answer,
                            now=timezone.now(), action=action, content=content)


def _check_elicitation(approval: Approval, *, action: str, content: Any) -> dict[str, Any]:
    """The stored answer ``{request, action, content}``; ApplicationError (400) for a bad
    action or content (naming the field)."""
    if action not in ELICITATION_ACTIONS:
        raise ApplicationError("`action` must be 'accept', 'decline' or 'cancel'.")
    request = (approval.elicitation or {}).get("request") or {}
    if action != "accept" or request.get("mode") != "form":
        return {"request": request, "action": action, "content": None}
    content = {} if content is None else content
    errors = content_errors(request.get("schema"), content)
    if errors:
        raise ApplicationError("The form is not valid: " + "; ".join(errors.values()) + ".",
                               extra={"errors": errors})
    return {"request": request, "action": action, "content": content}


def _check_decision(approval: Approval, *, decision: str, answer: str) -> str:
    """The cleaned answer; ApplicationError (400) for a missing/invalid decision or answer."""
    if approval.kind == ApprovalKind.ELICITATION:
        return ""
    if approval.kind == ApprovalKind.CLIENT_TOOL:
        raise ApplicationError("This tool runs in the API client: its next request brings the output.",
                               status_code=409)
    if approval.kind == ApprovalKind.CONNECTION and decision not in ("approve", "deny"):
        raise ApplicationError("`decision` must be 'approve' (the account is connected now) or 'deny' "
                               "(go on without it).")
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
                     now: datetime, action: str = "", content: Any = None) -> Approval:
    run = Run.objects.select_for_update(no_key=True).get(pk=approval.run_id)
    approval = Approval.objects.select_for_update(no_key=True).get(pk=approval.pk)
    answer = _check_decision(approval, decision=decision, answer=answer)
    elicitation = (_check_elicitation(approval, action=action, content=content)
                   if approval.kind == ApprovalKind.ELICITATION else None)
    if approval.status != ApprovalStatus.PENDING:
        if approval.decided_on_timeout:
            outcome = "approved" if approval.status == ApprovalStatus.APPROVED else "denied"
            raise ApplicationError(f"Nobody decided in time: the rule's on_timeout {outcome} this call.",
                                   status_code=409)
        raise ApplicationError(f"This approval is already {approval.status}.", status_code=409)
    if run.status not in ACTIVE_RUN_STATUSES:  # running/queued: the worker is about to pause it
        raise ApplicationError(f"The run is {run.status}; it no longer waits for this approval.", status_code=409)
    if approval.expires_at <= now:
        raise ApplicationError("This approval has expired.", status_code=409)
    if approval.kind == ApprovalKind.CONNECTION and decision == "approve":
        _check_connected(approval, run=run)
    _decision_apply(approval, decision=decision, reason=reason, answer=answer, elicitation=elicitation)
    approval.decided_by = user
    approval.decided_at = now
    approval.save(update_fields=["status", "answer", "decided_by", "decided_at", "elicitation"])
    _decision_record(approval, run=run, actor=user)
    run_resume(run=run, now=now)
    return approval


def _decision_apply(approval: Approval, *, decision: str, reason: str, answer: str,
                    elicitation: dict[str, Any] | None) -> None:
    """Set the pending ``approval``'s status and answer from a checked decision (not saved)."""
    if approval.kind == ApprovalKind.QUESTION:
        approval.status, approval.answer = ApprovalStatus.ANSWERED, answer
    elif approval.kind == ApprovalKind.CONNECTION:
        approval.status = ApprovalStatus.ANSWERED if decision == "approve" else ApprovalStatus.DENIED
        approval.answer = CONNECTED if decision == "approve" else (reason or "").strip()[:2000]
    elif elicitation is not None:  # the action only; the content is the server's to read
        approval.status, approval.answer, approval.elicitation = ApprovalStatus.ANSWERED, elicitation["action"], elicitation
    else:
        approval.status = ApprovalStatus.APPROVED if decision == "approve" else ApprovalStatus.DENIED
        approval.answer = (reason or "").strip()[:2000]
        if approval.kind == ApprovalKind.SAMPLING:  # the call, executed again, answers the server with it
            approval.elicitation = {"request": (approval.elicitation or {}).get("request") or {},
                                    "action": "accept" if decision == "approve" else "decline",
                                    "reason": approval.answer}


CONNECTED = "connected"
"""The answer of a ``connection`` approval whose account was connected."""


def _connection_request(approval: Approval) -> dict[str, Any]:
    request = (approval.elicitation or {}).get("request")
    return request if isinstance(request, dict) else {}


def _check_connected(approval: Approval, *, run: Run) -> None:
    """ApplicationError (409) unless the run's user (or the tenant) now holds a usable
    connection to the approval's server."""
    from capabilities.mcp_oauth.runs import connection_id_for_run

    request = _connection_request(approval)
    connection_id, why = connection_id_for_run(tenant_id=run.tenant_id, server_id=int(request.get("server_id") or 0),
                                               user_id=run.user_id)
    if connection_id is None:
        raise ApplicationError(f"Not connected yet: {why}", status_code=409)


def connection_approvals_answer(*, server_id: int, user_id: int | None, actor: AbstractBaseUser | None) -> int:
    """An account was connected: the pending ``connection`` approvals it settles are answered
    and their runs resume (:func:`run_resume`), as if their person had said so.

    Args:
        server_id: The MCP server connected.
        user_id: Whose account (``oauth_user``: only that user's runs wait for it); None: the
            tenant's (``oauth_tenant``: every run of the tenant waiting for this server).
        actor: Who connected (``decided_by``; None: nobody signed in, e.g. a refresh).

    Returns:
        How many approvals were answered. Requires the caller's tenant scope. Emits
        ``approval_resolved`` for each on commit.
    """
    waiting = Approval.objects.filter(kind=ApprovalKind.CONNECTION, status=ApprovalStatus.PENDING,
                                      elicitation__request__server_id=server_id)
    if user_id is not None:
        waiting = waiting.filter(run__user_id=user_id)
    answered = 0
    for approval_id, run_id in waiting.values_list("pk", "run_id"):
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
            approval = Approval.objects.select_for_update(no_key=True).get(pk=approval_id)
            if approval.status != ApprovalStatus.PENDING or run.status not in ACTIVE_RUN_STATUSES:
                continue
            now = timezone.now()
            approval.status, approval.answer, approval.decided_at = ApprovalStatus.ANSWERED, CONNECTED, now
            approval.decided_by = actor if actor is not None and actor.is_authenticated else None
            approval.save(update_fields=["status", "answer", "decided_by", "decided_at"])
            _decision_record(approval, run=run, actor=approval.decided_by)
            run_resume(run=run, now=now)
            answered += 1
    return answered


def _decision_record(approval: Approval, *, run: Run, actor: AbstractBaseUser | None) -> None:
    """What a decision leaves besides its row: the audit log entry (the decision, who made it,
    or ``by: timeout``, and for a tool call or a sampling request the reason given; never a question's answer or a
    form's content), ``approval_resolved`` on the session's stream and, after the commit, the
    run-event observers' ``approval_resolved`` (outbound webhooks' ``approval.decided``)."""
    detail: dict[str, Any] = {"run_id": run.pk, "tool_call_id": approval.tool_call_id, "kind": approval.kind}
    if approval.kind in (ApprovalKind.TOOL_CALL, ApprovalKind.SAMPLING) or (
            approval.kind == ApprovalKind.CONNECTION and approval.status == ApprovalStatus.DENIED):
        detail["reason"] = approval.answer
    if actor is None:
        detail["by"] = "timeout"
    audit_record(action=Action.APPROVAL_DECIDED, obj=approval, actor=actor if actor is not None else AnonymousUser(),
                 source=None if actor is not None else "system",
                 changes={"status": {"from": ApprovalStatus.PENDING, "to": approval.status}}, detail=detail)
    resolved = {"approval_id": approval.pk, "tool_call_id": approval.tool_call_id, "status": approval.status,
                "sub_run_id": approval.sub_run_id}
    event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="approval_resolved", data=resolved)
    if run_event_observers:
        observed = {**resolved, "kind": approval.kind, "tool_name": approval.tool_name,
                    "decided_by": actor.pk if actor is not None else None, "reason": detail.get("reason", ""),
                    "on_timeout": actor is None}
        tenant_id = run.tenant_id
        transaction.on_commit(lambda: run_event_observe(tenant_id, run.pk, "approval_resolved", observed))


def approvers_text(approval: Approval) -> str:
    """Who may decide ``approval``, in words: "the run's user", "role admin", "member #3"."""
    approvers = approval.approvers or {}
    if not approvers:
        return "the run's user"
    parts = ["the run's user"] if approvers.get("requester") else []
    parts += [f"role {role}" for role in approvers.get("roles") or []]
    parts += [f"member #{user_id}" for user_id in approvers.get("user_ids") or []]
    return ", ".join(parts) or "nobody"


CLIENT_OUTPUT_MAX_CHARS = 1_000_000
"""The longest output of a client tool kept (the rest is cut, as a server tool's result is)."""


def client_tool_outputs_submit(*, run: Run, outputs: dict[int, str], user: AbstractBaseUser) -> Run:
    """The API client's outputs of the calls of its own tools that paused ``run`` (Approvals of
    kind ``client_tool``): each becomes its call's result, and the run resumes once nothing
    else is pending (:func:`run_resume`), as after a human's decision.

    Args:
        run: The caller's paused user run (tenant scope of the caller).
        outputs: ``{tool call pk: output text}``, one for every pending client call of the run.
        user: Who sent them (``decided_by``).

    Returns:
        The run as stored (``queued`` when it resumed).

    Raises:
        ApplicationError: 409 when the run waits for no client output (finished, running) or
            its wait expired (the run then fails ``approval_expired``); 400 with
            ``extra={"unknown": [pk...]}`` for outputs of calls that do not wait, or
            ``extra={"missing": [pk...]}`` when a waiting call has no output.

    Emits ``approval_resolved`` per call on commit.
    """
    with transaction.atomic():  # committed before the caller gets its 409
        expired = approvals_expire(run_ids=[run.pk])
    if expired:
        raise ApplicationError("The run waited too long for the tools' outputs and has failed.", status_code=409)
    return _client_tool_outputs_submit(run_id=run.pk, outputs=outputs, user=user, now=timezone.now())


@transaction.atomic
def _client_tool_outputs_submit(*, run_id: int, outputs: dict[int, str], user: AbstractBaseUser,
                                now: datetime) -> Run:
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    if run.status != RunStatus.AWAITING_APPROVAL:
        raise ApplicationError(f"The run is {run.status}; it waits for no tool output.", status_code=409)
    pending = {a.tool_call_id: a for a in Approval.objects.select_for_update(no_key=True).filter(
        run=run, kind=ApprovalKind.CLIENT_TOOL, status=ApprovalStatus.PENDING)}
    unknown = sorted(set(outputs) - set(pending))
    if unknown:
        raise ApplicationError("These tool calls do not wait for an output.", extra={"unknown": unknown})
    missing = sorted(set(pending) - set(outputs))
    if missing:
        raise ApplicationError("Every waiting tool call needs its output.", extra={"missing": missing})
    for call_pk, approval in pending.items():
        approval.status, approval.answer = ApprovalStatus.ANSWERED, outputs[call_pk][:CLIENT_OUTPUT_MAX_CHARS]
        approval.decided_by, approval.decided_at = user, now
        approval.save(update_fields=["status", "answer", "decided_by", "decided_at"])
        event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="approval_resolved", data={
            "approval_id": approval.pk, "tool_call_id": call_pk, "status": approval.status,
            "sub_run_id": approval.sub_run_id,
        })
    run_resume(run=run, now=now)
    return run


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
    _elicitations_decline(qs.filter(kind__in=_DECLINED_ON_EXPIRY), now=now)
    _decide_on_timeout(qs.filter(kind=ApprovalKind.TOOL_CALL).exclude(on_timeout=ApprovalOnTimeout.FAIL_RUN), now=now)
    qs = qs.exclude(kind__in=_DECLINED_ON_EXPIRY).filter(status=ApprovalStatus.PENDING)
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


def _decide_on_timeout(qs: Any, *, now: datetime) -> None:
    """Tool-call approvals whose rule says what their expiry does (``on_timeout``): ``approve``
    leaves them ``approved``, ``deny`` ``expired`` (the call fails: "Nobody approved this tool
    call in time"), decided by nobody at ``now``; the run resumes once none is pending
    (:func:`run_resume`). Audited as decided ``by: timeout``."""
    for approval in qs.select_for_update(no_key=True):
        run = Run.objects.select_for_update(no_key=True).get(pk=approval.run_id)
        approval.status = (ApprovalStatus.APPROVED if approval.on_timeout == ApprovalOnTimeout.APPROVE
                           else ApprovalStatus.EXPIRED)
        approval.decided_at = now
        approval.save(update_fields=["status", "decided_at"])
        _decision_record(approval, run=run, actor=None)
        if run.status == RunStatus.AWAITING_APPROVAL:
            run_resume(run=run, now=now)


_DECLINED_ON_EXPIRY = (ApprovalKind.ELICITATION, ApprovalKind.SAMPLING, ApprovalKind.CONNECTION)


def _elicitations_decline(qs: Any, *, now: datetime) -> None:
    """An MCP server's request for input, or for the agent's model (sampling), nobody answered
    in time is declined (not a failed run): the approval is ``expired`` with action
    ``decline`` and the run resumes, executing the call again with that answer
    (:mod:`capabilities.mcp.elicitation`, :mod:`capabilities.mcp.sampling`). An account nobody
    connected in time (kind ``connection``): ``expired``, the call fails saying so."""
    for approval in qs.select_for_update(no_key=True):
        run = Run.objects.select_for_update(no_key=True).get(pk=approval.run_id)
        request = (approval.elicitation or {}).get("request") or {}
        sampling = approval.kind == ApprovalKind.SAMPLING
        approval.status, approval.answer, approval.decided_at = ApprovalStatus.EXPIRED, "" if sampling else "decline", now
        if approval.kind == ApprovalKind.CONNECTION:
            approval.answer = ""
        elif sampling:
            approval.elicitation = {"request": request, "action": "decline", "reason": ""}
        else:
            approval.elicitation = {"request": request, "action": "decline", "content": None}
        approval.save(update_fields=["status", "answer", "decided_at", "elicitation"])
        event_publish_on_commit(session_id=run.session_id, run_id=run.pk, type="approval_resolved", data={
            "approval_id": approval.pk, "tool_call_id": approval.tool_call_id, "status": approval.status,
            "sub_run_id": approval.sub_run_id,
        })
        if run.status == RunStatus.AWAITING_APPROVAL:
            run_resume(run=run, now=now)
