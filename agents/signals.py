"""Every saved change of an agent, of its bindings or of its route's entries records a version
(:mod:`agents.versions`)."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from agents.models import AgentInstance, CapabilityBinding
from guardrails.models import Guardrail
from llm.models import ModelRouteEntry


@receiver(post_save, sender=AgentInstance, dispatch_uid="agent_version_on_save")
def _agent_saved(sender: type, instance: AgentInstance, raw: bool = False, **kwargs: Any) -> None:
    if raw:  # loaddata
        return
    from agents.versions import agent_changed

    agent_changed(instance.pk)


def _deleting_the_agent(origin: Any) -> bool:
    """The deletion that removed a binding also removes its agent: it started at an agent or a
    tenant (an instance or a queryset). No version then: the agent's rows are going."""
    from tenants.models import Tenant

    model = getattr(origin, "model", type(origin))
    return isinstance(model, type) and issubclass(model, AgentInstance | Tenant)


@receiver(post_save, sender=CapabilityBinding, dispatch_uid="agent_version_on_binding_save")
@receiver(post_delete, sender=CapabilityBinding, dispatch_uid="agent_version_on_binding_delete")
def _binding_changed(sender: type, instance: CapabilityBinding, raw: bool = False, **kwargs: Any) -> None:
    if raw or _deleting_the_agent(kwargs.get("origin")):  # loaddata; the agent (or tenant) goes too
        return
    from agents.versions import agent_changed

    agent_changed(instance.agent_id)


@receiver(post_save, sender=Guardrail, dispatch_uid="agent_version_on_guardrail_save")
@receiver(post_delete, sender=Guardrail, dispatch_uid="agent_version_on_guardrail_delete")
def _guardrail_changed(sender: type, instance: Guardrail, raw: bool = False, **kwargs: Any) -> None:
    """A guardrail added, changed or removed is a change of its agent (a new version)."""
    if raw or _deleting_the_agent(kwargs.get("origin")):
        return
    from agents.versions import agent_changed

    agent_changed(instance.agent_id)


@receiver(post_save, sender=ModelRouteEntry, dispatch_uid="agent_version_on_route_entry_save")
@receiver(post_delete, sender=ModelRouteEntry, dispatch_uid="agent_version_on_route_entry_delete")
def _route_entry_changed(sender: type, instance: ModelRouteEntry, raw: bool = False, **kwargs: Any) -> None:
    """An edit of a route's entries (its fallback chain) is a change of every agent on that route:
    each records a version (the entries are part of it), so a published version keeps its own."""
    if raw or _deleting_the_agent(kwargs.get("origin")):
        return
    from agents.versions import agent_changed

    agent_ids = AgentInstance.all_tenants.filter(route_id=instance.route_id, tenant_id=instance.tenant_id)
    for agent_id in agent_ids.values_list("pk", flat=True):
        agent_changed(agent_id)
