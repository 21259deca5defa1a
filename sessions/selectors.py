"""Reads for sessions and runs. All require a tenant scope (they use scoped managers)."""

from __future__ import annotations

from itertools import chain
from typing import Any

from django.db.models import QuerySet

from sessions.models import ChatSession, LLMCall, Run, ToolCall


def chat_session_list(*, user_id: int) -> QuerySet[ChatSession]:
    """The user's sessions in the current tenant, most recently active first."""
    return ChatSession.objects.filter(user_id=user_id).select_related("agent").order_by("-updated_at", "-id")


def chat_session_get_for_user(*, session_id: int, user_id: int) -> ChatSession | None:
    """The session if it is in the current tenant and belongs to the user, else None."""
    return ChatSession.objects.select_related("agent").filter(pk=session_id, user_id=user_id).first()


def run_get_for_user(*, run_id: int, user_id: int) -> Run | None:
    """The run if it is in the current tenant and its session belongs to the user, else None."""
    return Run.objects.select_related("session").filter(pk=run_id, session__user_id=user_id).first()


def run_activities(*, run: Run) -> list[dict[str, Any]]:
    """LLM calls and tool calls of a run, in the order they started.

    Returns dicts ``{"kind": "llm_call" | "tool_call", "at": datetime, "object": row}``.
    """
    llm_calls = LLMCall.objects.filter(run=run).order_by("created_at", "id")
    tool_calls = ToolCall.objects.filter(run=run).order_by("created_at", "id")
    items = chain(
        ({"kind": "llm_call", "at": c.created_at, "object": c} for c in llm_calls),
        ({"kind": "tool_call", "at": c.started_at or c.created_at, "object": c} for c in tool_calls),
    )
    return sorted(items, key=lambda item: item["at"])
