"""A version pins its route's entries (the fallback chain): an edit of the route's entries is a
new version of every agent on it, the published version keeps running the entries it was
published with, and a rollback brings back those of the version rolled back to."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agents.models import AgentVersion
from agents.tests.factories import ProviderFactory, RouteEntryFactory, agent_with_route
from agents.versions import version_publish, version_rollback
from llm.models import ModelRouteEntry
from sessions.models import ChatSession, Run
from sessions.runner import database
from sessions.runs.claim import ClaimedRun
from sessions.services import message_post
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")]


def _models_run(world, agent) -> list[str]:
    """The models (in fallback order) of a new chat run of ``agent``, as the runner loads them."""
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    with tenant_scope(world.tenant.pk):
        run = message_post(session=session, user=world.member, content="hi")
        Run.all_tenants.filter(pk=run.pk).update(started_at=timezone.now())
        spec = database._spec(ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
    return [e.model for e in spec.entries]


def test_a_published_version_keeps_its_route_entries_and_a_rollback_brings_them_back(world):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    [entry] = ModelRouteEntry.all_tenants.filter(route=agent.route)
    v1 = version_publish(agent)
    assert [e["model"] for e in v1.config["route_entries"]] == ["model-0"]
    assert v1.config["route_entries"][0]["provider"] == entry.provider.name  # by name: no key, no URL

    entry.model = "model-0-new"
    entry.save()  # the route's edit is a new (draft) version of its agent...
    fallback = RouteEntryFactory(tenant=world.tenant, route=agent.route, position=5, model="fallback",
                                 provider=ProviderFactory(tenant=world.tenant, name="backup"))
    agent.refresh_from_db()
    numbers = list(AgentVersion.all_tenants.filter(agent=agent).order_by("number").values_list("number", flat=True))
    assert numbers == [1, 2, 3]
    assert _models_run(world, agent) == ["model-0"]  # ...and the published one still runs what it pinned

    v3 = version_publish(agent)
    assert _models_run(world, agent) == ["model-0-new", "fallback"]
    fallback.delete()  # a new draft without the fallback; v3 stays published with it
    agent.refresh_from_db()
    assert _models_run(world, agent) == ["model-0-new", "fallback"]

    version_rollback(agent, number=1)
    agent.refresh_from_db()
    assert _models_run(world, agent) == ["model-0"]
    assert agent.published_version_id == v1.pk != v3.pk
