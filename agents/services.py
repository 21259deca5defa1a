"""Writes for agents and bindings."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agents.models import AgentInstance, CapabilityBinding
from tenants.models import Tenant


@transaction.atomic
def agent_save(*, tenant: Tenant, agent: AgentInstance | None = None, **fields: Any) -> AgentInstance:
    agent = agent or AgentInstance(tenant=tenant)
    for name, value in fields.items():
        setattr(agent, name, value)
    agent.full_clean()
    agent.save()
    return agent


@transaction.atomic
def binding_save(*, tenant: Tenant, binding: CapabilityBinding | None = None, **fields: Any) -> CapabilityBinding:
    binding = binding or CapabilityBinding(tenant=tenant)
    for name, value in fields.items():
        setattr(binding, name, value)
    binding.full_clean()
    binding.save()
    return binding
