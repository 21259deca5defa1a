"""Reads for sessions and runs. All require a tenant scope (scoped managers, or the tenant in hand-written SQL)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from itertools import chain
from typing import Any

from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from agent_platform.model_rows import joined_instances, select_columns_sql
from agents.models import AgentInstance
from sessions.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Artifact,
    ChatSession,
    LLMCall,
    Run,
    ToolCall,
    UsageMonth,
)
from tenants.context import require_tenant_id
from tenants.models import ADMIN_ROLES, Membership


def month_start(now: datetime | None = None) -> datetime:
    """The start of the current calendar month, UTC (the period of tenant budgets)."""
    now = now or timezone.now()
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def chat_session_list(*, user_id: int) -> QuerySet[ChatSession]:
    """The user's sessions in the current tenant (deleted ones left out), most recently active first."""
    return (ChatSession.objects.filter(user_id=user_id, deleted_at__isnull=True).select_related("agent")
            .order_by("-updated_at", "-id"))


@functools.cache
def _chat_sql() -> tuple[str, str]:
    """:func:`chat_session_get_for_user`'s statement (the chat's columns, then its agent's:
    :mod:`agent_platform.model_rows`) and :func:`chat_session_visible_to_user`'s (``SELECT 1``);
    both take the chat's id, the user's and the tenant's."""
    chats, agents = ChatSession._meta.db_table, AgentInstance._meta.db_table
    rule = (f'"{chats}"."id" = %s AND "{chats}"."user_id" = %s AND "{chats}"."deleted_at" IS NULL '
            f'AND "{chats}"."tenant_id" = %s')
    with_agent = (
        f"SELECT {select_columns_sql(ChatSession, qualified=True)}, {select_columns_sql(AgentInstance, qualified=True)} "
        f'FROM "{chats}" INNER JOIN "{agents}" ON "{agents}"."id" = "{chats}"."{ChatSession._meta.get_field("agent").column}" '
        f"WHERE {rule}"
    )
    return with_agent, f'SELECT 1 FROM "{chats}" WHERE {rule} LIMIT 1'


def chat_session_get_for_user(*, session_id: int, user_id: int) -> ChatSession | None:
    """The session (its agent loaded) if it is in the current tenant, belongs to the user and
    is not deleted, else None.

    One hand-written statement, not a queryset (:mod:`agent_platform.model_rows`): every message
    POST makes this lookup, and building and compiling the ``select_related`` queryset cost
    ~1.1 ms of CPU on a 2-vCPU machine, this ~0.27 ms (bench/request_lookups.py).

    Raises:
        TenantScopeError: no tenant in context (as the scoped manager would).
    """
    with connection.cursor() as cursor:  # (a Django cursor: it applies the tenant scope)
        cursor.execute(_chat_sql()[0], [session_id, user_id, require_tenant_id()])
        row = cursor.fetchone()
    if row is None:
        return None
    session, agent = joined_instances((ChatSession, AgentInstance), row)
    session.agent = agent
    return session


def chat_session_visible_to_user(*, session_id: int, user_id: int) -> bool:
    """Whether :func:`chat_session_get_for_user` would find the session: the same rule, asked
    with ``SELECT 1`` (no row, no agent; an event stream's opening needs no more), hand-written
    as that one is: ~0.14 against ~0.62 ms of CPU as a queryset's ``exists()``.

    Raises:
        TenantScopeError: no tenant in context.
    """
    with connection.cursor() as cursor:
        cursor.execute(_chat_sql()[1], [session_id, user_id, require_tenant_id()])
        return cursor.fetchone() is not None


def run_get_for_user(*, run_id: int, user_id: int) -> Run | None:
    """The run if it is in the current tenant and its session belongs to the user and is not
    deleted, else None (every run-level API of the user: detail, activities, trace, cancel,
    edit, retry)."""
    return Run.objects.select_related("session").filter(
        pk=run_id, session__user_id=user_id, session__deleted_at__isnull=True
    ).first()


def run_activities(*, run: Run) -> list[dict[str, Any]]:
    """LLM calls, tool calls and sub-runs (skills) of a run, in the order they started.

    Returns dicts ``{"kind": "llm_call" | "tool_call" | "sub_run", "at": datetime, "object": row}``
    (``sub_run`` items also ``"skill"``: the skill's name).
    """
    llm_calls = LLMCall.objects.filter(run=run).order_by("created_at", "id")
    tool_calls = ToolCall.objects.filter(run=run).order_by("created_at", "id")
    sub_runs = Run.objects.filter(parent_tool_call__run=run).select_related("skill", "parent_tool_call")
    items = chain(
        ({"kind": "llm_call", "at": c.created_at, "object": c} for c in llm_calls),
        ({"kind": "tool_call", "at": c.started_at or c.created_at, "object": c} for c in tool_calls),
        ({"kind": "sub_run", "at": r.created_at, "object": r,
          "skill": r.skill.name if r.skill is not None else r.parent_tool_call.name} for r in sub_runs),
    )
    return sorted(items, key=lambda item: item["at"])


def month_bounds(month: str | None) -> tuple[datetime, datetime]:
    """``"YYYY-MM"`` (None: this month) → [start, end) in UTC. Raises ValueError."""
    if month:
        try:
            start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
        except ValueError as exc:
            raise ValueError(f"month must be YYYY-MM, got {month!r}") from exc
    else:
        start = month_start()
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


USAGE_SUMS = {
    "llm_calls": Count("id"),
    "prompt_tokens": Coalesce(Sum("prompt_tokens"), 0),
    "completion_tokens": Coalesce(Sum("completion_tokens"), 0),
    "cost_usd_micros": Coalesce(Sum("cost_usd_micros"), 0),
}
"""The sums of a usage row: LLM calls (attempts), prompt and completion tokens, micro-USD."""


def tenant_month_cost_usd_micros(now: datetime | None = None) -> int:
    """Micro-USD of the current tenant's LLM calls (every purpose, purged chats' included)
    in the calendar month (UTC) of ``now`` (default: this one): what the monthly budget is
    held against.

    Reads the month's :class:`~sessions.models.UsageMonth` rows (at most
    :data:`~sessions.models.USAGE_MONTH_SHARDS`, kept equal to the calls' sums by the database: triggers and the runner's turn save),
    not the month's calls: the same cost at 10 calls or 1M. Requires tenant scope.
    """
    month = month_start(now).date()
    total = UsageMonth.objects.filter(month=month).aggregate(total=Sum("cost_usd_micros"))["total"]
    return int(total or 0)


def tenant_usage(*, start: datetime, end: datetime, purposes: Sequence[str] | None = None) -> dict[str, Any]:
    """LLM usage of the current tenant in [start, end) (UTC): every LLM call, whatever its
    purpose, including those of purged chats (their rows outlive the runs); with
    ``purposes`` (``LLMCallPurpose`` values), only the calls of those purposes (totals and
    every breakdown).

    Returns:
        ``{"total": {...}, "by_agent": [{"agent_id", "agent", ...}], "by_user": [{"user_id",
        "user", ...}], "by_purpose": [{"purpose", ...}], "by_run_purpose": [{"run_purpose", ...}]}``;
        every row has :data:`USAGE_SUMS`'
        keys (llm_calls, prompt_tokens, completion_tokens, cost_usd_micros), most expensive
        first. ``agent``/``user`` are names (None: a call for no agent or user, or one since
        deleted); ``purpose`` an ``LLMCallPurpose`` value; ``run_purpose`` the calls' run's
        ``RunPurpose`` (chat, api, evaluation, schedule, webhook; None: a call of no run, e.g. a
        title or memory, or of a run since purged).
    """
    calls = LLMCall.objects.filter(created_at__gte=start, created_at__lt=end)
    if purposes is not None:
        calls = calls.filter(purpose__in=list(purposes))
    by_agent = (calls.values("agent_id", "agent__name").annotate(**USAGE_SUMS)
                .order_by("-cost_usd_micros", "agent__name", "agent_id"))
    by_user = (calls.values("user_id", "user__username").annotate(**USAGE_SUMS)
               .order_by("-cost_usd_micros", "user__username", "user_id"))
    by_purpose = calls.values("purpose").annotate(**USAGE_SUMS).order_by("-cost_usd_micros", "purpose")
    by_run_purpose = (calls.values("run__purpose").annotate(**USAGE_SUMS)
                      .order_by("-cost_usd_micros", "run__purpose"))
    sums = tuple(USAGE_SUMS)
    return {
        "total": calls.aggregate(**USAGE_SUMS),
        "by_agent": [{"agent_id": r["agent_id"], "agent": r["agent__name"], **{k: r[k] for k in sums}}
                     for r in by_agent],
        "by_user": [{"user_id": r["user_id"], "user": r["user__username"], **{k: r[k] for k in sums}}
                    for r in by_user],
        "by_purpose": [{"purpose": r["purpose"], **{k: r[k] for k in sums}} for r in by_purpose],
        "by_run_purpose": [{"run_purpose": r["run__purpose"], **{k: r[k] for k in sums}} for r in by_run_purpose],
    }


def artifact_get_for_user(*, artifact_id: int, user_id: int) -> Artifact | None:
    """The artifact if it is in the current tenant and its session belongs to the user, else None."""
    return Artifact.objects.filter(
        pk=artifact_id, session__user_id=user_id, session__deleted_at__isnull=True
    ).defer("content").first()


def artifact_list_for_session(*, session_id: int) -> QuerySet:
    return Artifact.objects.filter(session_id=session_id).defer("content").order_by("id")


APPROVALS_MINE = ("requester", "approver")
"""``GET /api/v1/approvals/?mine=``: ``requester``, the pending approvals of the caller's own
runs (whoever decides them); ``approver``, the caller's inbox: the pending approvals the caller
may decide, of any run of the tenant."""


def member_role(*, user_id: int) -> str | None:
    """The user's role (``owner``, ``admin``, ``member``) in the current tenant; None when the
    user is not a member."""
    return Membership.objects.filter(user_id=user_id).values_list("role", flat=True).first()


def approvers_resolve(approvers: Mapping[str, Any] | None) -> dict[str, Any]:
    """An approval rule's ``approvers`` as an Approval stores them, in the current tenant:
    ``{"requester": bool, "roles": [role, ...], "user_ids": [id, ...]}``; ``{}`` (the run's user,
    today's default) when the rule names none.

    ``members`` (user ids or e-mail addresses, :func:`agents.models.approval_policy_errors`)
    become the ids of the tenant's members they name; those no longer members are dropped.
    When nobody is left (no requester, no role, no member found) the tenant's owners and admins
    decide, so that the call is neither stuck nor decided by the run's user against the rule.
    """
    if not approvers:
        return {}
    resolved = {"requester": bool(approvers.get("requester")), "roles": sorted(set(approvers.get("roles") or [])),
                "user_ids": _member_user_ids(approvers.get("members") or [])}
    if not (resolved["requester"] or resolved["roles"] or resolved["user_ids"]):
        resolved["roles"] = sorted(ADMIN_ROLES)
    return resolved


def _member_user_ids(members: Sequence[Any]) -> list[int]:
    """The user ids of the current tenant's members that ``members`` (user ids or e-mail
    addresses, any case) name, sorted; those not members are left out."""
    ids = {m for m in members if isinstance(m, int) and not isinstance(m, bool)}
    emails = {m.lower() for m in members if isinstance(m, str)}
    if not (ids or emails):
        return []
    rows = Membership.objects.values_list("user_id", "user__email")
    return sorted({user_id for user_id, email in rows if user_id in ids or (email or "").lower() in emails})


def approvals_decidable_q(*, user_id: int, role: str | None) -> Q:
    """The approvals user ``user_id`` (of role ``role`` in the current tenant) may decide: as
    the run's user when the approvers include the requester (or name nobody: the default), as
    a named member, or by role. Status is not looked at."""
    q = Q(run__user_id=user_id) & (Q(approvers={}) | Q(approvers__requester=True))
    q |= Q(approvers__user_ids__contains=[user_id])
    if role:
        q |= Q(approvers__roles__contains=[role])
    return q


def approval_may_decide(approval: Approval, *, user_id: int, role: str | None) -> bool:
    """Whether user ``user_id`` (of role ``role`` in the approval's tenant) is one of the
    approval's approvers (:func:`approvals_decidable_q`, in Python: ``approval.run`` is read)."""
    approvers = approval.approvers or {}
    if (not approvers or approvers.get("requester")) and approval.run.user_id == user_id:
        return True
    return user_id in (approvers.get("user_ids") or []) or (role is not None and role in (approvers.get("roles") or []))


def approval_get_for_user(*, approval_id: int, user_id: int) -> Approval | None:
    """The approval if it is in the current tenant, in a chat that is not deleted, and the
    user sees it: it belongs to a run of the user's, or the user may decide it
    (:func:`approvals_decidable_q`); else None."""
    role = member_role(user_id=user_id)
    return (
        Approval.objects.filter(pk=approval_id, run__session__deleted_at__isnull=True)
        .filter(Q(run__session__user_id=user_id) | approvals_decidable_q(user_id=user_id, role=role))
        .select_related("run__user", "run__session__agent", "sub_run__skill").first()
    )


def approval_list_pending(*, user_id: int, mine: str = "requester") -> QuerySet[Approval]:
    """Pending approvals and questions in the current tenant (deleted chats' left out), oldest
    first. A pause for a tool the API client runs (kind ``client_tool``) is not listed: the
    client that offered the tool answers it, not a person.

    Args:
        user_id: The caller.
        mine: ``requester``: those of the user's own runs (whoever decides them);
            ``approver``: those the user may decide (:func:`approvals_decidable_q`), of any
            run of the tenant: a reviewer's inbox (:data:`APPROVALS_MINE`).
    """
    qs = Approval.objects.filter(run__session__deleted_at__isnull=True, status=ApprovalStatus.PENDING)
    if mine == "approver":
        qs = qs.filter(approvals_decidable_q(user_id=user_id, role=member_role(user_id=user_id)))
    else:
        qs = qs.filter(run__session__user_id=user_id)
    return (
        qs.exclude(kind=ApprovalKind.CLIENT_TOOL)
        .select_related("run__user", "run__session__agent", "sub_run__skill").order_by("id")
    )
