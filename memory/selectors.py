"""Reads of memories. All need a tenant scope (``Memory.objects`` fails closed) unless they say
they run in system scope.

Cross-user isolation lives here: every read of a user's memories names the user, and a
memory of another user (or tenant) is ``None``, exactly like a missing one.

Vector search is exact: the search filters by (tenant, user, agent, dimensions), which a
b-tree index narrows to one user's few hundred memories at most, then orders them by cosine
distance. An approximate (HNSW) index over the whole table would filter *after* its scan and
return fewer rows than asked for such a selective filter (pgvector's README, "Filtering");
for this shape of query pgvector recommends the exact index on the filter columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Exists, F, Max, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from pgvector.django import CosineDistance

from agents.models import AgentInstance, CapabilityBinding
from memory.models import Memory, MemoryExtraction
from memory.policy import KEY, MemoryPolicy
from sessions.models import ChatSession, Run, RunPurpose


def memory_policy_for_agent(*, agent_id: int) -> MemoryPolicy | None:
    """The agent's memory policy (its first enabled ``memory`` binding), or None: memory off."""
    binding = (CapabilityBinding.objects.filter(agent_id=agent_id, kind=KEY, enabled=True)
               .order_by("id").only("config").first())
    return MemoryPolicy.from_config(binding.config) if binding is not None else None


def memory_list_for_user(*, user_id: int, agent_id: int | None = None) -> QuerySet[Memory]:
    """The user's memories in the current tenant (of one agent, or all), newest first."""
    qs = Memory.objects.filter(user_id=user_id).defer("embedding")
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    return qs.order_by("-updated_at", "-id")


def memory_get_for_user(*, memory_id: int, user_id: int) -> Memory | None:
    """The memory if it is the user's, in the current tenant; else None (missing and foreign alike)."""
    return Memory.objects.filter(pk=memory_id, user_id=user_id).defer("embedding").first()


@dataclass(frozen=True, slots=True)
class Similar:
    """A memory and its cosine similarity to a query (1 = same direction)."""

    memory: Memory
    similarity: float


def memory_similar(
    *, user_id: int, agent_id: int, embedding: Sequence[float], embedding_model: str, limit: int,
    min_similarity: float = -1.0,
) -> list[Similar]:
    """The user+agent's memories most similar to ``embedding``, most similar first.

    Only memories embedded by ``embedding_model`` with ``len(embedding)`` dimensions are
    compared (vectors of different models are not comparable). Exact search (see the module
    docstring). Requires tenant scope.

    Args:
        embedding: The query vector (L2-normalised).
        limit: At most this many (positive).
        min_similarity: Leave out memories less similar than this (cosine similarity, -1..1).
    """
    vector = list(embedding)
    qs = (Memory.objects.filter(user_id=user_id, agent_id=agent_id, dimensions=len(vector),
                                embedding_model=embedding_model)
          .annotate(distance=CosineDistance("embedding", vector)).defer("embedding").order_by("distance", "id"))
    out = []
    for memory in qs[:limit]:
        similarity = 1.0 - float(memory.distance)
        if similarity < min_similarity:
            break
        out.append(Similar(memory=memory, similarity=similarity))
    return out


def memory_agent_visible(*, agent_id: int) -> AgentInstance | None:
    """The agent, if it is in the current tenant (active or not: its memories stay readable)."""
    return AgentInstance.objects.filter(pk=agent_id).only("id", "name").first()


def memory_agents_enabled() -> dict[int, tuple[int, MemoryPolicy]]:
    """``{agent_id: (tenant_id, policy)}`` of every active agent with memory on, in every tenant.

    Runs in system scope (the beat tasks).
    """
    out: dict[int, tuple[int, MemoryPolicy]] = {}
    # tenant-bypass: the beat's scan covers every tenant (it runs in system scope).
    bindings = (CapabilityBinding.all_tenants.filter(kind=KEY, enabled=True, agent__is_active=True)
                .order_by("agent_id", "id").values_list("agent_id", "tenant_id", "config"))
    for agent_id, tenant_id, config in bindings:
        out.setdefault(agent_id, (tenant_id, MemoryPolicy.from_config(config)))
    return out


def sessions_due_for_extraction(*, now: datetime, limit: int = 200) -> list[tuple[int, int]]:
    """``[(session_id, tenant_id)]`` of sessions whose new messages are due for extraction.

    Due: the session's agent has memory on, the session is not deleted and is not an
    evaluation experiment's (no run of purpose ``evaluation``: an experiment's questions are not
    its admin's conversation), its last message is
    older than the agent's ``extract_after_idle_minutes``, it has a message past its watermark,
    no failed attempt asked to wait (``retry_after``) and no extraction holds it. Oldest
    activity first, at most ``limit``. Runs in system scope (the beat task).
    """
    agents = memory_agents_enabled()
    if not agents:
        return []
    by_idle: dict[int, list[int]] = {}
    for agent_id, (_tenant_id, policy) in agents.items():
        by_idle.setdefault(policy.extract_after_idle_minutes, []).append(agent_id)
    # tenant-bypass: the beat's scan covers every tenant (system scope); tasks narrow it per session.
    state = MemoryExtraction.all_tenants.filter(session_id=OuterRef("pk"))
    idle_filter = Q()
    for minutes, agent_ids in by_idle.items():
        idle_filter |= Q(agent_id__in=agent_ids, last_at__lt=now - timedelta(minutes=minutes))
    rows = (
        ChatSession.all_tenants.filter(agent_id__in=list(agents), deleted_at__isnull=True)  # tenant-bypass: as above
        .annotate(
            last_id=Max("messages__id"), last_at=Max("messages__created_at"),
            watermark=Coalesce(Subquery(state.values("last_message_id")[:1]), Value(0)),
            retry_after=Subquery(state.values("retry_after")[:1]),
            lease_until=Subquery(state.values("lease_until")[:1]),
        )
        .filter(idle_filter, last_id__gt=F("watermark"))
        .filter(~Exists(Run.all_tenants.filter(session_id=OuterRef("pk"), purpose=RunPurpose.EVALUATION)))
        .filter(Q(retry_after__isnull=True) | Q(retry_after__lte=now))
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lte=now))
        .order_by("last_at")
        .values_list("pk", "tenant_id")[:limit]
    )
    return list(rows)
