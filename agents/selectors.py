"""Reads for agents (tenant scope required)."""

from django.db.models import QuerySet

from agents.models import AgentInstance


def agent_list_active() -> QuerySet[AgentInstance]:
    """Active agents of the current tenant, by name."""
    return AgentInstance.objects.filter(is_active=True).order_by("name")


def agent_get_active(*, agent_id: int) -> AgentInstance | None:
    return AgentInstance.objects.filter(pk=agent_id, is_active=True).first()
