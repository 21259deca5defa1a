"""A skill's sub-run: opened inside its parent's tool call (→ running, or resumed), paused
for a human (→ awaiting_approval) and ended (→ completed | failed | cancelled).

Sub-runs have no heartbeat of their own (the parent's covers them), no worker hand-off (the
parent's worker runs them inside the skill call) and are never touched by the sweeper or the
tenant's run limit. A parent that ends first ends its sub-runs with it
(:func:`sessions.runs.ending.run_end`); a user's cancel of a waiting sub-run is
:mod:`sessions.runs.cancellation`. Every function expects the caller's tenant scope.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agents.models import AgentInstance
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalStatus,
    ChatSession,
    MessageRole,
    Run,
    RunPurpose,
    RunStatus,
    ToolCall,
    ToolCallStatus,
)
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db
from sessions.runs.ending import RunEnding, end_event, run_end
from sessions.runs.records import Publish, approval_payload, message_insert


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
    *, parent: RunSpec, call_pk: int, skill_id: int | None, skill_name: str, task: str,
    publisher: Callable[[int], Publish], agent_version_id: int | None = None,
) -> SubRunState:
    """The sub-run answering tool call ``call_pk`` of run ``parent``: created now (status
    ``running``, the task as its user message), or the existing one (a parent resumed after its
    worker died, or after a human answered an approval inside the sub-run, re-executes the
    call: an active sub-run resumes, ``running``, attempt + 1; an ended one is returned as it
    is).

    Sub-runs have no heartbeat of their own (the parent's covers them) and are never
    touched by the sweeper or the tenant's run limit.

    ``publisher(run_id)``: the sub-run's publisher (the caller's, which adds the parent's ids).

    A sub-agent's sub-run (capability kind ``agent``) has ``agent_version_id`` (the version of
    the agent it runs: ``Run.agent_version``) and no skill.

    Emits, after the commit, when the sub-run is running now: ``run_running {attempt, skill,
    depth, task}`` (``skill``: ``skill_name``; a sub-agent's: ``agent`` instead of ``skill``).
    Nothing for an ended one.
    """
    state = await db(_subrun_open)(parent=parent, call_pk=call_pk, skill_id=skill_id, task=task,
                                   agent_version_id=agent_version_id)
    if state.status == RunStatus.RUNNING:
        who = {"agent": skill_name} if agent_version_id is not None else {"skill": skill_name}
        await publisher(state.run_id)("run_running", {"attempt": state.attempt, **who,
                                                      "depth": parent.depth + 1, "task": task})
    return state


@transaction.atomic
def _subrun_open(*, parent: RunSpec, call_pk: int, skill_id: int | None, task: str,
                 agent_version_id: int | None = None) -> SubRunState:
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
    purpose = Run.objects.filter(session_id=parent.session_id, tool_calls__pk=call_pk).values_list(
        "purpose", flat=True
    ).first()  # the calling run's entry point, the sub-run's too
    run = Run.objects.create(
        tenant_id=parent.tenant_id, session_id=parent.session_id, user_id=parent.user_id, input=task,
        status=RunStatus.RUNNING, attempt=1, started_at=timezone.now(), parent_tool_call_id=call_pk,
        depth=parent.depth + 1, skill_id=skill_id, agent_version_id=agent_version_id,
        purpose=purpose or RunPurpose.CHAT,
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
    recorded = await db(subrun_end)(run_id=run_id, status=ending.status, reply=ending.reply, error=ending.error,
                                     reason=ending.reason, attempt=attempt)
    if recorded:
        await publish(*end_event(ending))
    return recorded


@transaction.atomic
def subrun_end(
    *, run_id: int, status: str, reply: str = "", error: str = "", reason: str = "", attempt: int | None = None,
) -> bool:
    """End sub-run ``run_id`` (:func:`~sessions.runs.ending.run_end`) and add its tokens and cost
    to its parent run, publishing nothing: :func:`subrun_finish`'s transaction, and a waiting
    sub-run's cancel (:mod:`sessions.runs.cancellation`, in the caller's transaction).
    ``attempt``: as for :func:`subrun_finish`; returns False if refused. The parent's totals then include everything done on
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


async def session_handoff(*, spec: RunSpec, agent_id: int, reply: str, publish: Publish) -> bool:
    """A handoff (capability kind ``agent`` with ``handoff: true``) from the user's run ``spec``,
    after its turn's tool results are saved: the chat's agent becomes ``agent_id`` for the rest
    of the session (later messages run it) and the handed-to agent's ``reply`` is saved as the
    run's answer (an assistant message after the results).

    Emits ``agent_handoff {from_agent, to_agent, to_agent_id}`` after the commit.

    Returns:
        False when the chat already has that agent (a handoff call executed again after its
        worker died): nothing written or published.

    Raises:
        AgentInstance.DoesNotExist: no such agent in the current tenant.
    """
    data = await db(_session_handoff)(spec=spec, agent_id=agent_id, reply=reply)
    if data is None:
        return False
    await publish("agent_handoff", data)
    return True


@transaction.atomic
def _session_handoff(*, spec: RunSpec, agent_id: int, reply: str) -> dict[str, Any] | None:
    """:func:`session_handoff`'s transaction."""
    session = ChatSession.objects.select_for_update(no_key=True).select_related("agent").get(pk=spec.session_id)
    if session.agent_id == agent_id:
        return None
    to = AgentInstance.objects.get(pk=agent_id)
    from_name = session.agent.name
    ChatSession.objects.filter(pk=session.pk).update(agent_id=to.pk)
    message_insert(session_id=spec.session_id, run_id=spec.run_id, role=MessageRole.ASSISTANT, content=reply)
    return {"from_agent": from_name, "to_agent": to.name, "to_agent_id": to.pk}
