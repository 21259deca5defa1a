"""Writes for sessions and runs: the API's entry points. A run's status and the rows a run
writes are :mod:`sessions.runs`' (the run lifecycle); these validate the caller's input and
call it."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Approval,
    ApprovalStatus,
    Artifact,
    ChatSession,
    Message,
    MessageRole,
    Run,
    RunFailureReason,
    RunStatus,
)
from sessions.pinned_resources import pinned_resources_for_run, with_pinned_resources
from sessions.runs import (
    approval_decide,
    approvals_expire,
    client_tool_outputs_submit,
    run_cancel,
    run_create,
    run_enqueue_on_commit,
    run_finish_unheld,
    run_hand_off,
    run_purpose,
    stale_before,
)

__all__ = [
    "MAX_ARTIFACT_BYTES", "MAX_MESSAGE_CHARS", "QUEUED_RESEND_SECONDS", "approval_decide", "approvals_expire",
    "artifact_create", "chat_from_conversation", "chat_session_create", "client_tool_outputs_submit", "message_post",
    "run_cancel",
    "run_enqueue_on_commit", "run_purpose", "runs_sweep",
]

MAX_MESSAGE_CHARS = 100_000


@transaction.atomic
def chat_session_create(*, user: AbstractBaseUser, agent: AgentInstance, title: str = "") -> ChatSession:
    """Open a session with ``agent`` for ``user`` in the agent's tenant."""
    if not agent.is_active:
        raise ApplicationError("This agent is not active.")
    session = ChatSession(tenant_id=agent.tenant_id, agent=agent, user=user, title=title[:200])
    # The agent and the user are in hand: checking that their rows exist would be a query each.
    session.full_clean(exclude=["tenant", "agent", "user"])
    session.save()
    return session



TITLE_TARGET_CHARS = 60
"""A title made from the first message is cut at a word boundary near this length."""

_MD_NOISE = re.compile(r"[`*_#>\[\]()~|]+")


def chat_title_from(content: str) -> str:
    """A short chat title from the first user message: its first non-empty line, Markdown
    marks and attachment lines removed, cut at a word boundary to about 60 characters.

    Returns "" for a message with no words (the chat stays "New chat")."""
    for line in str(content or "").splitlines():
        line = line.strip()
        if not line or line.startswith(("[attachment:", "```")):
            continue
        text = re.sub(r"\s+", " ", _MD_NOISE.sub(" ", line)).strip()
        if not text:
            continue
        if len(text) <= TITLE_TARGET_CHARS:
            return text
        cut = text[:TITLE_TARGET_CHARS + 1].rsplit(" ", 1)[0].rstrip(" ,;:.-")
        return (cut or text[:TITLE_TARGET_CHARS]) + "…"
    return ""


@transaction.atomic
def message_post(*, session: ChatSession, user: AbstractBaseUser, content: str,
                 request_options: dict[str, Any] | None = None) -> Run:
    """Post a user message: records it, creates a queued Run, and queues the run
    (:func:`sessions.runs.run_create`; ``request_options``: an API caller's, kept with the run,
    with the MCP resources pinned to the chat added: :mod:`sessions.pinned_resources`).

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
    locked = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    if ChatSession.agent.is_cached(session) and session.agent_id == locked.agent_id:
        locked.agent = session.agent  # as the caller read it (the API's selector joins it): no query more
    session = locked
    if not session.title:
        session.title = chat_title_from(content)[:200]
    request_options = with_pinned_resources(request_options, pinned_resources_for_run(session=session))
    return run_create(session=session, user=user, content=content, request_options=request_options)


CONVERSATION_ROLES = (MessageRole.USER, MessageRole.ASSISTANT)
"""The roles a conversation given whole (:func:`chat_from_conversation`) may hold before its
last message."""


@transaction.atomic
def chat_from_conversation(
    *, user: AbstractBaseUser, agent: AgentInstance, history: list[tuple[str, str]], content: str,
    request_options: dict[str, Any] | None = None,
) -> Run:
    """A new chat with ``agent`` holding a conversation a caller gave whole (the OpenAI chat
    completions API sends every message each time), and a queued run answering its last message.

    Args:
        history: The messages before the last one, in order: ``[(role, text)]``, role ``user`` or
            ``assistant`` (:data:`CONVERSATION_ROLES`). They are written as messages of the new
            run, before its own user message, so the run's history is the conversation as given.
        content: The last user message (what the run answers; the run's ``input``).
        request_options: What the caller asked of the run (``Run.request_options``: client
            tools, instructions, response format), or None.

    Returns:
        The run (queued; handed to a worker on commit, like :func:`message_post`'s).

    Raises:
        ApplicationError: an inactive agent, an empty or over-long message, a role outside
            :data:`CONVERSATION_ROLES`.
    """
    for role, text in history:
        if role not in CONVERSATION_ROLES:
            raise ApplicationError(f"A message of role {role!r} cannot be part of a chat's history.")
        if len(text) > MAX_MESSAGE_CHARS:
            raise ApplicationError(f"A message is longer than {MAX_MESSAGE_CHARS} characters.")
    first_user = next((text for role, text in history if role == MessageRole.USER), content)
    session = chat_session_create(user=user, agent=agent, title=chat_title_from(first_user))
    session.next_position = len(history)
    session.save(update_fields=["next_position"])
    run = message_post(session=session, user=user, content=content, request_options=request_options)
    Message.objects.bulk_create([
        Message(tenant_id=session.tenant_id, session=session, run=run, position=position, role=role, content=text)
        for position, (role, text) in enumerate(history)
    ])
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
                run_finish_unheld(run=run, status=RunStatus.FAILED, error=error, reason=RunFailureReason.WORKER_LOST,
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
        run_hand_off(run_id)
        counts["resent"] += 1
    return counts
