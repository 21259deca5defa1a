"""factory_boy factories for providers, routes, agents and bindings. Pass ``tenant=``."""

from __future__ import annotations

import factory

from agents.models import AgentInstance, CapabilityBinding, CapabilityKind
from llm.models import ModelProvider, ModelRoute, ModelRouteEntry


class TenantOwnedFactory(factory.django.DjangoModelFactory):
    """Creates through ``all_tenants``: tests build rows for several tenants outside any scope."""

    class Meta:
        abstract = True

    @classmethod
    def _get_manager(cls, model_class):
        return model_class.all_tenants


class ProviderFactory(TenantOwnedFactory):
    class Meta:
        model = ModelProvider

    name = factory.Sequence(lambda n: f"provider-{n}")
    base_url = "http://127.0.0.1:9/v1"


class RouteFactory(TenantOwnedFactory):
    class Meta:
        model = ModelRoute

    name = factory.Sequence(lambda n: f"route-{n}")


class RouteEntryFactory(TenantOwnedFactory):
    class Meta:
        model = ModelRouteEntry

    route = factory.SubFactory(RouteFactory, tenant=factory.SelfAttribute("..tenant"))
    provider = factory.SubFactory(ProviderFactory, tenant=factory.SelfAttribute("..tenant"))
    model = "fake-model"
    position = factory.Sequence(lambda n: n)
    max_input_tokens = 8192
    max_output_tokens = 256
    connect_timeout_seconds = 2.0
    read_timeout_seconds = 5.0


class AgentFactory(TenantOwnedFactory):
    class Meta:
        model = AgentInstance

    name = factory.Sequence(lambda n: f"Agent {n}")
    description = factory.Faker("sentence")
    system_prompt = "You are a test agent."
    route = factory.SubFactory(RouteFactory, tenant=factory.SelfAttribute("..tenant"))


class BuiltinBindingFactory(TenantOwnedFactory):
    class Meta:
        model = CapabilityBinding

    kind = CapabilityKind.BUILTIN
    builtin_name = "todo_write"


def agent_with_route(*, tenant, base_urls: list[str], tool_calls: str = "native", read_timeout_seconds: float = 5.0,
                     max_retries: int = 0, **agent_fields) -> AgentInstance:
    """An agent whose route has one entry per base URL, in order (provider names p0, p1, …).

    Entries do not retry by default (``max_retries=0``), so a scripted failure moves straight
    to the next entry; pass ``max_retries`` to test retries.
    """
    route = RouteFactory(tenant=tenant)
    for i, url in enumerate(base_urls):
        provider = ProviderFactory(tenant=tenant, name=f"p{i}-{route.pk}", base_url=url)
        RouteEntryFactory(tenant=tenant, route=route, provider=provider, position=i, model=f"model-{i}",
                          tool_calls=tool_calls, read_timeout_seconds=read_timeout_seconds, max_retries=max_retries)
    return AgentFactory(tenant=tenant, route=route, **agent_fields)


def bind_builtin(agent: AgentInstance, name: str, **fields) -> CapabilityBinding:
    return BuiltinBindingFactory(tenant=agent.tenant, agent=agent, builtin_name=name, **fields)
