"""The ``agent`` capability kind's binding rules: another agent of the tenant, never itself, never
a cycle (A→B→A and longer), refused by the model's clean and by the admin API (400); the tool
it is offered as. Runs of sub-agents: ``sessions/tests/test_sub_agents.py``."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agents.models import CapabilityBinding
from agents.tests.factories import AgentFactory
from capabilities.registry import binding_specs
from capabilities.subagents.kind import TASK_SCHEMA, cycle_through

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _bind(caller, callee, **config):
    return CapabilityBinding.all_tenants.create(tenant=caller.tenant, agent=caller, kind="agent",
                                                config={"agent": callee.pk, **config})


def _clean(caller, callee, **config):
    CapabilityBinding(tenant=caller.tenant, agent=caller, kind="agent", config={"agent": callee.pk, **config}).full_clean()


def test_cycle_through_finds_the_shortest_path_back():
    edges = {2: {3}, 3: {1, 4}}
    assert cycle_through(edges, start=1, target=2) == [2, 3, 1]
    assert cycle_through(edges, start=5, target=2) is None


def test_a_binding_names_an_agent_of_its_tenant_never_itself(world, other_world):
    a, b = AgentFactory(tenant=world.tenant), AgentFactory(tenant=world.tenant)
    theirs = AgentFactory(tenant=other_world.tenant, description="their secret agent")
    _clean(a, b)
    _clean(a, b, name="ask_b", description="Ask B.", handoff=True,
           input_schema={"type": "object", "properties": {"q": {"type": "string"}}})
    with pytest.raises(ValidationError, match="Agent not found"):
        _clean(a, theirs)
    with pytest.raises(ValidationError, match="cannot be bound into itself"):
        _clean(a, a)
    with pytest.raises(ValidationError, match="Name the agent"):
        CapabilityBinding(tenant=world.tenant, agent=a, kind="agent", config={}).full_clean()
    for bad, message in [({"name": "bad name!"}, "letters, digits"), ({"handoff": "yes"}, "true or false"),
                         ({"input_schema": {"type": "string"}}, "type object"), ({"extra": 1}, "Unknown keys")]:
        with pytest.raises(ValidationError, match=message):
            _clean(a, b, **bad)


def test_a_cycle_of_bindings_is_refused_when_saved(world):
    a, b, c = (AgentFactory(tenant=world.tenant, name=n) for n in ("Alpha", "Beta", "Gamma"))
    _bind(a, b)
    with pytest.raises(ValidationError, match="cycle of agents calling agents: Beta → Alpha → Beta"):
        _clean(b, a)
    _bind(b, c)
    with pytest.raises(ValidationError, match="Gamma → Alpha → Beta → Gamma"):
        _clean(c, a)
    _clean(c, AgentFactory(tenant=world.tenant))  # a tree is fine
    # Editing an existing binding into a cycle is refused too.
    bc = CapabilityBinding.all_tenants.get(agent=b)
    bc.config = {"agent": a.pk}
    with pytest.raises(ValidationError, match="Alpha → Beta"):
        bc.full_clean()


def test_the_admin_api_refuses_a_cycle_and_another_tenants_agent_with_400(world, other_world):
    a, b = AgentFactory(tenant=world.tenant), AgentFactory(tenant=world.tenant)
    theirs = AgentFactory(tenant=other_world.tenant, name="Their secret agent")
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/bindings/", {"agent": a.pk, "kind": "agent", "config": {"agent": b.pk}},
                       format="json")
    assert resp.status_code == 201, resp.content
    resp = client.post("/api/v1/admin/bindings/", {"agent": b.pk, "kind": "agent", "config": {"agent": a.pk}},
                       format="json")
    assert resp.status_code == 400 and "cycle" in str(resp.json()["extra"]["fields"]["config"])
    resp = client.post("/api/v1/admin/bindings/", {"agent": a.pk, "kind": "agent", "config": {"agent": theirs.pk}},
                       format="json")
    assert resp.status_code == 400 and "Agent not found" in str(resp.json()["extra"]["fields"]["config"])
    assert "secret" not in resp.content.decode()


def test_the_tool_is_named_and_described_from_the_agent_or_the_binding(world):
    a = AgentFactory(tenant=world.tenant)
    b = AgentFactory(tenant=world.tenant, name="Research bot", slug="research-bot", description="Finds things.")
    inactive = AgentFactory(tenant=world.tenant, is_active=False)
    rows = [_bind(a, b), _bind(a, b, handoff=True), _bind(a, inactive)]
    specs = binding_specs(rows)
    assert [(s.name, s.description, s.handoff) for s in specs] == [
        ("research_bot", "Finds things.", False),
        ("transfer_to_research_bot", "Hand the conversation over to the agent Research bot: Finds things.", True),
    ]
    b.refresh_from_db()
    assert specs[0].parameters == TASK_SCHEMA
    assert specs[0].version_id == (b.published_version_id or b.draft_version_id) is not None
