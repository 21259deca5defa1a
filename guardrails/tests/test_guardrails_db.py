"""Guardrails with the database: the admin API, versions (snapshot, a pinned version runs its own),
agents as code (a lossless round trip), and a model check through the production ports on the
fake model server (its LLM call counted with purpose ``guardrail``, the trip audited)."""

from __future__ import annotations

import io

import pytest
import yaml
from channels.db import database_sync_to_async as sync_to_async
from django.core.management import call_command

from agents.models import AgentVersion
from agents.tests.factories import AgentFactory, RouteFactory, agent_with_route
from agents.versions import agent_config, run_pin, version_publish
from guardrails.models import Guardrail
from guardrails.specs import CONFIG_FIELDS
from llm.testing import Reply
from sessions.models import LLMCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync, reload_run
from tenants.models import AuditEvent

GUARDRAIL_VALUES = {
    "name": "No cards",
    "point": "tool_result",
    "kind": "pii",
    "position": 3,
    "enabled": False,
    "action": "mask",
    "on_error": "fail_open",
    "config": {"types": ["card", "iban"]},
    "message": "No card numbers here.",
}
"""A value, not the default, for every configuration field of a guardrail but ``route``."""


def test_the_fixture_sets_every_guardrail_field():
    """A new Guardrail field fails here until the snapshot, the fixture and the round trip below have it."""
    fields = {f.name for f in Guardrail._meta.concrete_fields} - {"id", "tenant", "agent", "created_at", "updated_at"}
    assert fields == set(CONFIG_FIELDS) == {*GUARDRAIL_VALUES, "route"}
    for name, value in GUARDRAIL_VALUES.items():
        assert value != Guardrail._meta.get_field(name).get_default(), name


@pytest.mark.django_db
@pytest.mark.usefixtures("all_tenants_scope")
def test_guardrails_are_in_the_version_and_round_trip_through_yaml(world, tmp_path):
    route = RouteFactory(tenant=world.tenant, name="judge-route")
    agent = AgentFactory(tenant=world.tenant, route=route, slug="guarded")
    assert "guardrails" not in agent_config(agent), "an agent without guardrails keeps its snapshot's shape"
    Guardrail.all_tenants.create(tenant=world.tenant, agent=agent, **GUARDRAIL_VALUES)
    Guardrail.all_tenants.create(tenant=world.tenant, agent=agent, name="Polite", point="output", kind="model_check",
                                 config={"rubric": "Be polite."}, route=route)
    latest = AgentVersion.all_tenants.filter(agent=agent).order_by("-number").first()
    assert [g["name"] for g in latest.config["guardrails"]] == ["Polite", "No cards"]  # run order: point, position
    assert latest.config["guardrails"][0]["route"] == "judge-route"
    original = agent_config(agent)

    out = io.StringIO()
    call_command("agents_export", stdout=out, tenant=world.tenant.slug, agent="guarded")
    text = out.getvalue()
    assert yaml.safe_load(text)["agents"][0]["guardrails"] == original["guardrails"]
    path = tmp_path / "agents.yaml"
    path.write_text(text)
    Guardrail.all_tenants.filter(agent=agent).delete()
    call_command("agents_import", str(path), stdout=io.StringIO())
    assert agent_config(agent) == original
    assert Guardrail.all_tenants.get(agent=agent, name="No cards").route is None

    doc = yaml.safe_load(text)
    doc["agents"][0]["guardrails"][0]["config"] = {"pattern": "(unclosed"}
    doc["agents"][0]["guardrails"][0]["kind"] = "regex"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match="not a valid regular expression"):
        call_command("agents_import", str(path), stdout=io.StringIO())
    assert agent_config(agent) == original, "a refused import changes nothing"


@pytest.mark.django_db
@pytest.mark.usefixtures("all_tenants_scope")
def test_the_admin_api_validates_and_records_versions(world, other_world):
    client = world.client(admin=True)
    agent = AgentFactory(tenant=world.tenant)
    body = {"agent": agent.pk, "name": "Short", "point": "output", "kind": "max_length", "config": {"max_chars": 500}}
    created = client.post("/api/v1/admin/guardrails/", body, format="json")
    assert created.status_code == 201, created.content
    gid = created.json()["id"]
    assert client.get(f"/api/v1/admin/guardrails/?agent={agent.pk}").json()["results"][0]["name"] == "Short"
    bad = client.patch(f"/api/v1/admin/guardrails/{gid}/", {"config": {"max_chars": 0}}, format="json")
    assert bad.status_code == 400 and "max_chars" in bad.json()["extra"]["fields"]["config"][0]
    mask = client.patch(f"/api/v1/admin/guardrails/{gid}/", {"action": "mask"}, format="json")
    assert mask.status_code == 400 and "action" in mask.json()["extra"]["fields"]
    judge = client.post("/api/v1/admin/guardrails/", {**body, "name": "Judge", "kind": "model_check",
                                                       "config": {"rubric": "x"}}, format="json")
    assert judge.status_code == 400 and "route" in judge.json()["extra"]["fields"]
    their_route = RouteFactory(tenant=other_world.tenant)
    foreign = client.post("/api/v1/admin/guardrails/", {**body, "name": "Judge", "kind": "model_check",
                                                         "config": {"rubric": "x"}, "route": their_route.pk},
                          format="json")
    assert foreign.status_code == 400 and "route" in foreign.json()["extra"]["fields"]
    assert client.delete(f"/api/v1/admin/guardrails/{gid}/").status_code == 204
    numbers = list(AgentVersion.all_tenants.filter(agent=agent).order_by("number").values_list("config", flat=True))
    assert ["guardrails" in c for c in numbers] == [False, True, False], "created, then deleted: a version each"
    assert world.client().get("/api/v1/admin/guardrails/").status_code == 403


@sync_to_async
def _setup(world, url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    Guardrail.all_tenants.create(tenant=world.tenant, agent=agent, name="Polite", point="output", kind="model_check",
                                 config={"rubric": "The answer must be polite."}, route=agent.route)
    return agent


@sync_to_async
def _rows(run_id, agent_id):
    calls = list(LLMCall.all_tenants.filter(agent_id=agent_id).order_by("id").values_list("purpose", "run_id"))
    audits = list(AuditEvent.all_tenants.filter(action="guardrail_tripped").values_list("tenant_id", "object_id",
                                                                                         "detail"))
    return calls, audits


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue", "all_tenants_scope")
async def test_a_model_check_through_the_production_ports(world, fake_llm):
    agent = await _setup(world, fake_llm.base_url)
    fake_llm.script(Reply("Go away."), Reply("FAIL\nThe answer is rude."))
    run = await sync_to_async(post_message_sync)(agent=agent, user=world.member, content="hello")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason, run.reply) == ("failed", "guardrail_tripped", "")
    assert run.error == "The agent's guardrail “Polite” stopped this answer."
    assert "The answer must be polite." in fake_llm.requests[1]["messages"][1]["content"]
    calls, audits = await _rows(run.pk, agent.pk)
    assert sorted(calls) == [("guardrail", None), ("turn", run.pk)]  # the answer's turn call is written at the trip
    [(tenant_id, object_id, detail)] = audits
    assert (tenant_id, object_id, detail["guardrail"], detail["point"]) == (world.tenant.pk, str(run.pk), "Polite",
                                                                            "output")
    assert "rude" in detail["reason"]


@sync_to_async
def _versioned(world, url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    Guardrail.all_tenants.create(tenant=world.tenant, agent=agent, name="No Oslo", point="output", kind="deny_list",
                                 config={"words": ["Oslo"]})
    version_publish(agent)
    Guardrail.all_tenants.filter(agent=agent).delete()  # the draft has none; the published version keeps it
    agent.refresh_from_db()
    with run_pin(draft=True):
        draft_run = post_message_sync(agent=agent, user=world.member, content="capital?")
    published_run = post_message_sync(agent=agent, user=world.member, content="capital?")
    return draft_run, published_run


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue", "all_tenants_scope")
async def test_a_run_applies_the_guardrails_of_its_version(world, fake_llm):
    draft_run, published_run = await _versioned(world, fake_llm.base_url)
    fake_llm.script(Reply("Oslo."), Reply("Oslo."))
    await execute_run(draft_run.pk)
    await execute_run(published_run.pk)
    assert (await reload_run(draft_run.pk)).status == "completed"
    published = await reload_run(published_run.pk)
    assert (published.status, published.reason) == ("failed", "guardrail_tripped")
