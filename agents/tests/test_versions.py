"""Agent versions: recorded on save, publish / rollback / diff over the admin API, what a run uses."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.db import connection
from django.utils import timezone

from agents.models import AgentInstance, AgentVersion, CapabilityBinding
from agents.tests.factories import AgentFactory, agent_with_route, bind_builtin
from agents.versions import agent_config, content_hash, run_pin, version_publish
from sessions.models import ChatSession, Run
from sessions.runner import database
from sessions.runs.claim import ClaimedRun
from sessions.services import message_post
from sessions.trace_selectors import run_trace
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _numbers(agent: AgentInstance) -> list[int]:
    return list(AgentVersion.all_tenants.filter(agent=agent).order_by("number").values_list("number", flat=True))


def test_each_saved_change_is_a_version_and_the_same_content_is_not(world):
    agent = AgentFactory(tenant=world.tenant, system_prompt="one")
    assert _numbers(agent) == [1]
    agent.save()
    agent.refresh_from_db()
    assert _numbers(agent) == [1], "a save that changes nothing makes no version"
    agent.system_prompt = "two"
    agent.save()
    binding = bind_builtin(agent, "todo_write")
    assert _numbers(agent) == [1, 2, 3]
    binding.delete()
    agent.refresh_from_db()
    latest = AgentVersion.all_tenants.get(agent=agent, number=4)
    assert agent.draft_version_id == latest.pk and agent.published_version_id is None
    v3 = AgentVersion.all_tenants.get(agent=agent, number=3)
    assert v3.config["system_prompt"] == "two" and v3.config["route"] == agent.route.name
    assert v3.config["bindings"][0]["kind"] == "builtin" and v3.config["bindings"][0]["builtin_name"] == "todo_write"
    canonical = json.dumps(v3.config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert v3.content_hash == hashlib.sha256(canonical.encode()).hexdigest()
    assert latest.content_hash == AgentVersion.all_tenants.get(agent=agent, number=2).content_hash, (
        "v4 (binding removed) has v2's content; it is still a new version (the draft moved)"
    )


def test_publish_rollback_versions_and_diff_over_the_admin_api(world):
    agent = AgentFactory(tenant=world.tenant, system_prompt="first")
    api = world.client(admin=True)
    base = f"/api/v1/admin/agents/{agent.pk}"
    resp = api.post(f"{base}/publish/", {"note": "go live"}, format="json")
    assert resp.status_code == 200 and resp.json() == {"published": 1, "draft": 1}
    resp = api.patch(f"{base}/", {"system_prompt": "second", "max_loop_count": 5}, format="json")
    assert resp.status_code == 200
    listed = api.get(f"{base}/versions/").json()
    assert (listed["published"], listed["draft"]) == (1, 2)
    assert [v["number"] for v in listed["versions"]] == [2, 1]
    assert listed["versions"][0]["created_by"] == world.admin.username and listed["versions"][1]["note"] == "go live"
    diff = api.get(f"{base}/versions/2/diff/?against=1").json()
    assert diff["from"] == 1 and diff["to"] == 2
    assert {c["field"]: (c["before"], c["after"]) for c in diff["changes"]} == {
        "system_prompt": ("first", "second"),
        "max_loop_count": (16, 5),
    }
    assert "-first" in diff["changes"][1]["diff"] and "+second" in diff["changes"][1]["diff"]
    assert api.post(f"{base}/publish/", {}, format="json").json() == {"published": 2, "draft": 2}
    assert api.post(f"{base}/rollback/", {"version": 1}, format="json").json() == {"published": 1, "draft": 2}
    resp = api.post(f"{base}/rollback/", {"version": 9}, format="json")
    assert resp.status_code == 404 and "no version 9" in resp.json()["message"]
    assert api.post(f"{base}/rollback/", {}, format="json").status_code == 400
    assert api.get(f"{base}/versions/2/diff/?against=x").status_code == 400
    assert world.client().post(f"{base}/publish/", {}, format="json").status_code == 403, "members may not publish"


def test_another_tenants_admin_cannot_see_or_publish_our_versions(world, other_world):
    agent = AgentFactory(tenant=world.tenant, system_prompt="first")
    agent.system_prompt = "second"
    agent.save()
    theirs = other_world.client(admin=True)
    base = f"/api/v1/admin/agents/{agent.pk}"
    assert theirs.get(f"{base}/versions/").status_code == 404
    assert theirs.get(f"{base}/versions/2/diff/").status_code == 404
    assert theirs.post(f"{base}/publish/", {}, format="json").status_code == 404
    assert theirs.post(f"{base}/rollback/", {"version": 1}, format="json").status_code == 404
    agent.refresh_from_db()
    assert agent.published_version_id is None


def _spec_of(run: Run):
    """The RunSpec the runner builds at the claim (started as a claim would)."""
    Run.all_tenants.filter(pk=run.pk).update(started_at=timezone.now())
    with tenant_scope(run.tenant_id):
        return database._spec(ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))


def test_a_new_chat_runs_the_published_version_and_the_playground_the_draft(world, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], system_prompt="published")
    bind_builtin(agent, "todo_write")
    v_published = version_publish(agent)
    agent.system_prompt = "draft"
    agent.max_loop_count = 3
    agent.save()
    CapabilityBinding.all_tenants.filter(agent=agent).delete()
    agent.refresh_from_db()
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    with tenant_scope(world.tenant.pk):
        chat_run = message_post(session=session, user=world.member, content="hi")
    assert chat_run.agent_version_id == v_published.pk, "the run records the version it runs"
    spec = _spec_of(chat_run)
    assert (spec.system_prompt, spec.max_loop_count) == ("published", 16)
    [builtin] = spec.bindings_of("builtin")
    assert builtin.name == "todo_write"
    Run.all_tenants.filter(pk=chat_run.pk).update(status="completed", finished_at=timezone.now())
    with tenant_scope(world.tenant.pk):
        trace = run_trace(run=Run.objects.get(pk=chat_run.pk), admin=True)["run"]
    assert (trace["agent_version"], trace["system_prompt"]) == (v_published.number, "published")
    with tenant_scope(world.tenant.pk), run_pin(draft=True):
        playground_run = message_post(session=session, user=world.member, content="hi")
    assert playground_run.agent_version_id == agent.draft_version_id
    spec = _spec_of(playground_run)
    assert (spec.system_prompt, spec.max_loop_count, spec.bindings) == ("draft", 3, ())


def test_the_chat_api_runs_the_draft_for_admins_only(world, no_enqueue):
    agent = AgentFactory(tenant=world.tenant, system_prompt="published")
    published = version_publish(agent)
    agent.system_prompt = "draft"
    agent.save()
    agent.refresh_from_db()
    for who, admin in ((world.admin, True), (world.member, False)):
        api = world.client(admin=admin)
        sid = api.post("/api/v1/sessions/", {"agent": agent.pk}, format="json").json()["id"]
        resp = api.post(f"/api/v1/sessions/{sid}/messages/", {"content": "hi", "draft": True}, format="json")
        if admin:
            assert resp.status_code == 201
            assert Run.all_tenants.get(pk=resp.json()["run"]["id"]).agent_version_id == agent.draft_version_id
        else:
            assert resp.status_code == 403, who
            resp = api.post(f"/api/v1/sessions/{sid}/messages/", {"content": "hi"}, format="json")
            assert Run.all_tenants.get(pk=resp.json()["run"]["id"]).agent_version_id == published.pk


def test_the_console_lists_diffs_publishes_and_rolls_back(world, other_world):
    from django.test import Client
    from django.urls import reverse

    agent = AgentFactory(tenant=world.tenant, system_prompt="first")
    client = Client()
    client.force_login(world.admin)
    change_url = reverse("admin:agents_agentinstance_change", args=[agent.pk])
    page = client.get(change_url)
    versions_url = reverse("admin:agents_agentinstance_versions", args=[agent.pk])
    assert versions_url in page.content.decode()
    form = page.context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items() if k not in ("route",)}
    data.update({"route": agent.route_id, "system_prompt": "second", "bindings-TOTAL_FORMS": 0,
                 "bindings-INITIAL_FORMS": 0, "bindings-MIN_NUM_FORMS": 0, "bindings-MAX_NUM_FORMS": 1000})
    data = {k: v for k, v in data.items() if not isinstance(v, bool) or v}
    resp = client.post(change_url, data)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    v2 = AgentVersion.all_tenants.get(agent=agent, number=2)
    assert v2.created_by == world.admin and v2.config["system_prompt"] == "second"
    html = client.get(f"{versions_url}?diff=2&against=1").content.decode()
    assert 'data-testid="version-diff"' in html and "-first" in html and "+second" in html
    assert client.post(versions_url, {"version": "2", "action": "publish", "note": "ship"}).status_code == 302
    agent.refresh_from_db()
    assert agent.published_version.number == 2 and agent.published_version.note == "ship"
    client.post(versions_url, {"version": "1", "action": "rollback"})
    agent.refresh_from_db()
    assert agent.published_version.number == 1
    theirs = Client()
    theirs.force_login(other_world.admin)
    assert theirs.get(versions_url).status_code == 404
    assert theirs.post(versions_url, {"version": "2"}).status_code == 404
    agent.refresh_from_db()
    assert agent.published_version.number == 1


def test_deleting_an_agent_or_its_tenant_with_versions_and_runs_works(world, other_world):
    agent = AgentFactory(tenant=world.tenant)
    bind_builtin(agent, "todo_write")
    version_publish(agent)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="x",
                                 agent_version=agent.published_version)
    mine = AgentFactory(tenant=world.tenant)
    bind_builtin(mine, "todo_write")
    CapabilityBinding.all_tenants.filter(agent=mine).delete()
    assert _numbers(mine) == [1, 2, 3], "a binding deleted on its own is a version"
    ChatSession.all_tenants.filter(pk=session.pk).delete()
    AgentInstance.all_tenants.filter(pk=agent.pk).delete()
    assert not AgentVersion.all_tenants.filter(agent_id=agent.pk).exists()
    assert not Run.all_tenants.filter(pk=run.pk).exists()
    theirs = AgentFactory(tenant=other_world.tenant)
    bind_builtin(theirs, "todo_write")
    from tenants.models import Tenant

    Tenant.objects.filter(pk=other_world.tenant.pk).delete()
    assert not AgentVersion.all_tenants.filter(tenant_id=other_world.tenant.pk).exists()
    connection.check_constraints()  # the deferred foreign keys hold (no version made for a deleted agent)


def test_the_migration_gives_existing_agents_version_1_as_their_unpublished_draft(world):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("agents.migrations.0008_agent_versions")
    agent = AgentFactory(tenant=world.tenant, system_prompt="before versions")
    bind_builtin(agent, "todo_write")
    AgentInstance.all_tenants.filter(pk=agent.pk).update(draft_version=None)
    AgentVersion.all_tenants.filter(agent=agent).delete()  # as before the migration
    migration._first_versions(apps, None)
    agent.refresh_from_db()
    [v1] = AgentVersion.all_tenants.filter(agent=agent)
    assert (v1.number, agent.draft_version_id, agent.published_version_id) == (1, v1.pk, None)
    assert v1.config == agent_config(agent) and v1.content_hash == content_hash(agent_config(agent))
    agent.save()
    assert _numbers(agent) == [1], "the next save with the same content makes no version"
