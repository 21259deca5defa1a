"""An agent's own checks (``AgentInstance.clean``): its route belongs to its tenant, and its name
and slug are free in the tenant. The admin API's use of them is tested in ``test_slug.py``.

Written from ``make mutation``'s approval-policy target (issue 35), which mutates
agents/models.py: no test of the target reached these checks.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agents.models import AgentInstance
from agents.tests.factories import AgentFactory, RouteFactory

pytestmark = pytest.mark.django_db


def _errors(agent: AgentInstance) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        agent.clean()
    return caught.value.message_dict


def test_a_route_of_another_tenant_is_not_found(world, other_world, all_tenants_scope):
    theirs = RouteFactory(tenant=other_world.tenant)
    agent = AgentInstance(tenant=world.tenant, name="Helper", route=theirs)
    assert _errors(agent) == {"route": ["Route not found."]}
    agent.route = RouteFactory(tenant=world.tenant)
    agent.clean()
    assert agent.slug == "helper"


def test_a_name_or_slug_taken_in_the_tenant_is_refused(world, other_world, all_tenants_scope):
    route = RouteFactory(tenant=world.tenant)
    AgentFactory(tenant=world.tenant, name="Helper", slug="helper")
    assert _errors(AgentInstance(tenant=world.tenant, name="Helper", slug="other", route=route)) == {
        "name": ["Another agent of this tenant is called 'Helper'."]
    }
    assert _errors(AgentInstance(tenant=world.tenant, name="Other", slug="helper", route=route)) == {
        "slug": ["Another agent of this tenant has the slug 'helper'."]
    }
    # the same name and slug in another tenant are free
    AgentInstance(
        tenant=other_world.tenant, name="Helper", slug="helper", route=RouteFactory(tenant=other_world.tenant)
    ).clean()
