import pytest

from agents.models import AgentInstance
from agents.tests.factories import AgentFactory
from tenants.scoping import TenantScopeError, current_tenant_id, tenant_scope

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@pytest.mark.django_db
def test_scoped_manager_fails_closed_without_a_tenant(tenant):
    AgentFactory(tenant=tenant)
    with pytest.raises(TenantScopeError):
        list(AgentInstance.objects.all())


@pytest.mark.django_db
def test_scoped_manager_returns_only_the_current_tenants_rows(tenant, other_tenant):
    mine = AgentFactory(tenant=tenant)
    AgentFactory(tenant=other_tenant)
    with tenant_scope(tenant.pk):
        assert list(AgentInstance.objects.all()) == [mine]
        assert AgentInstance.objects.filter(pk=mine.pk).exists()
    with tenant_scope(other_tenant.pk):
        assert not AgentInstance.objects.filter(pk=mine.pk).exists()


def test_tenant_scope_nests_and_restores():
    assert current_tenant_id() is None
    with tenant_scope(1):
        with tenant_scope(2):
            assert current_tenant_id() == 2
        assert current_tenant_id() == 1
    assert current_tenant_id() is None


def test_tenant_scope_rejects_non_int():
    with pytest.raises(TypeError):
        with tenant_scope("1"):  # type: ignore[arg-type]
            pass


@pytest.mark.django_db
def test_deleting_a_tenant_deletes_everything_it_owns(world, other_world):
    from agents.tests.factories import RouteEntryFactory
    from llm.models import ModelRoute
    from sessions.models import ChatSession, Run

    entry = RouteEntryFactory(tenant=world.tenant)
    agent = AgentFactory(tenant=world.tenant, route=entry.route)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="x")
    kept = AgentFactory(tenant=other_world.tenant)
    world.tenant.delete()
    assert not AgentInstance.all_tenants.filter(tenant_id=entry.tenant_id).exists()
    assert not ModelRoute.all_tenants.filter(pk=entry.route_id).exists()
    assert AgentInstance.all_tenants.filter(pk=kept.pk).exists()


@pytest.mark.django_db
def test_a_route_in_use_by_an_agent_cannot_be_deleted(tenant):
    from django.db.models import RestrictedError

    agent = AgentFactory(tenant=tenant)
    with pytest.raises(RestrictedError):
        agent.route.delete()
