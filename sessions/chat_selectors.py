"""Reads behind the chat app's chat list, search, badges and the member's own usage. All
require a tenant scope (scoped managers) and filter by the calling user."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from sessions.models import Approval, ApprovalStatus, ChatSession, LLMCall, Message, MessageRole, Run, RunStatus
from sessions.selectors import USAGE_SUMS, chat_session_list

MAX_QUERY_CHARS = 200


def chat_session_search(*, user_id: int, query: str = "", activity: str = "") -> QuerySet[ChatSession]:
    """The user's sessions (deleted ones left out), most recently active first, each annotated
    with ``is_running`` and ``awaits_approval`` (bools: a user run of it is queued/running, or
    waits for an approval) for the sidebar's badges.

    Args:
        query: case-insensitive text to find in the title or in any user/assistant message
            of the session (its visible, not superseded runs); stripped, at most 200 chars.
        activity: "active" keeps only sessions that are running or awaiting an approval.
    """
    qs = chat_session_list(user_id=user_id)
    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if query:
        matching = Message.objects.filter(
            session_id=OuterRef("pk"), role__in=[MessageRole.USER, MessageRole.ASSISTANT],
            run__superseded_at__isnull=True, content__icontains=query,
        )
        qs = qs.filter(Q(title__icontains=query) | Exists(matching))
    user_runs = Run.objects.filter(session_id=OuterRef("pk"), parent_tool_call__isnull=True)
    qs = qs.annotate(
        is_running=Exists(user_runs.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])),
        awaits_approval=Exists(
            Approval.objects.filter(run__session_id=OuterRef("pk"), status=ApprovalStatus.PENDING)
        ),
    )
    if activity == "active":
        qs = qs.filter(Q(is_running=True) | Q(awaits_approval=True))
    return qs


def chat_session_get_deleted_for_user(*, session_id: int, user_id: int) -> ChatSession | None:
    """The user's session ``session_id`` in the current tenant, deleted or not (for Undo)."""
    return ChatSession.objects.filter(pk=session_id, user_id=user_id).first()


def user_usage(
    *, user_id: int, start: datetime, end: datetime, purposes: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The user's model usage in the current tenant in [start, end) (UTC): every LLM call
    made for them (their runs' turns and compactions, skills' sub-runs included; their chats'
    titles and memory; their searches' query rewrites and reranks; deleted and purged chats
    and superseded answers too: they were spent); with ``purposes`` (``LLMCallPurpose``
    values), only the calls of those purposes (totals and every breakdown).

    Returns:
        ``{"total": {llm_calls, prompt_tokens, completion_tokens, cost_usd_micros},
        "by_agent": [{agent_id, agent, ...same sums}], "by_purpose": [{purpose, ...same sums}]}``,
        most expensive first.
    """
    calls = LLMCall.objects.filter(user_id=user_id, created_at__gte=start, created_at__lt=end)
    if purposes is not None:
        calls = calls.filter(purpose__in=list(purposes))
    by_agent = (calls.values("agent_id", "agent__name").annotate(**USAGE_SUMS)
                .order_by("-cost_usd_micros", "agent__name", "agent_id"))
    by_purpose = calls.values("purpose").annotate(**USAGE_SUMS).order_by("-cost_usd_micros", "purpose")
    return {
        "total": calls.aggregate(**USAGE_SUMS),
        "by_agent": [{"agent_id": r["agent_id"], "agent": r["agent__name"], **{k: r[k] for k in USAGE_SUMS}}
                     for r in by_agent],
        "by_purpose": [{"purpose": r["purpose"], **{k: r[k] for k in USAGE_SUMS}} for r in by_purpose],
    }


def session_usage(*, session_id: int) -> dict[str, int]:
    """Every LLM call of a session's runs (superseded answers and skills included; not its
    title's or memory's, which have no run): ``{llm_calls, prompt_tokens, completion_tokens,
    cost_usd_micros}``."""
    return LLMCall.objects.filter(run__session_id=session_id).aggregate(**USAGE_SUMS)
