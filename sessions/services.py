"""Writes for sessions and runs."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from sessions.events import event_publish_on_commit
from sessions.models import ACTIVE_RUN_STATUSES, Artifact, ChatSession, Message, MessageRole, Run, RunStatus

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
    """Hand the run to a worker once the transaction commits."""
    from sessions.tasks import run_execute

    transaction.on_commit(lambda: run_execute.delay(run_id))


@transaction.atomic
def message_post(*, session: ChatSession, user: AbstractBaseUser, content: str) -> Run:
    """Post a user message: records it, creates a queued Run, and queues the run.

    Messages posted while another run of the session is active queue behind it and run next,
    in order (the worker that finishes a run starts the next queued one).

    Raises:
        ApplicationError: empty or over-long content.

    Emits ``run_queued`` on commit.
    """
    content = content.strip()
    if not content:
        raise ApplicationError("The message is empty.")
    if len(content) > MAX_MESSAGE_CHARS:
        raise ApplicationError(f"The message is longer than {MAX_MESSAGE_CHARS} characters.")
    session = ChatSession.objects.select_for_update().get(pk=session.pk)
    run = Run.objects.create(tenant_id=session.tenant_id, session=session, user=user, input=content)
    Message.objects.create(
        tenant_id=session.tenant_id, session=session, run=run, role=MessageRole.USER,
        content=content, position=session.next_position,
    )
    session.next_position += 1
    if not session.title:
        session.title = content[:80]
    session.save(update_fields=["next_position", "title", "updated_at"])
    event_publish_on_commit(session_id=session.pk, run_id=run.pk, type="run_queued", data={"input": content})
    run_enqueue_on_commit(run_id=run.pk)
    return run


def session_has_earlier_active_run(*, run: Run) -> bool:
    """Whether a run of the same session, created before ``run``, is still queued or running."""
    return (
        Run.objects.filter(session_id=run.session_id, status__in=ACTIVE_RUN_STATUSES, pk__lt=run.pk)
        .exists()
    )


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
    - ``running``: only the Redis cancel signal is set; the worker stops the run within
      about a second and records ``cancelled`` itself (the returned run is still ``running``).

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

    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status not in ACTIVE_RUN_STATUSES:
        raise ApplicationError("The run has already finished.", status_code=409)
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
