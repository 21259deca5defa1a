"""An agent's output schema and routing rules on the database side: the checks (a rule may only
name its own tenant's routes), the admin API and console form, what the runner loads at the
claim (routes read in the run's tenant only), the entries' native JSON-schema mode, and the trace.
The run loop's side is sessions/tests/test_agent_output_and_routing.py."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.models import AgentInstance
from agents.tests.factories import AgentFactory, RouteFactory, agent_with_route
from llm.config import RouteEntryConfig
from llm.models import ModelRouteEntry
from llm.providers.openai_compat import build_request
from llm.types import ChatMessage, ToolSpec
from sessions.models import ChatSession, Run
from sessions.runner import database
from sessions.runs.claim import ClaimedRun
from sessions.services import message_post
from sessions.trace_selectors import run_trace
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_rule_may_name_only_a_route_of_its_own_tenant(world, other_world):
    RouteFactory(tenant=other_world.tenant, name="globex-vision")
    agent = AgentFactory(tenant=world.tenant)
    agent.routing_rules = [{"name": "pictures", "route": "globex-vision", "images": True}]
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert refused.value.message_dict["routing_rules"] == ["Rule 1: the tenant has no model route 'globex-vision'."]
    agent.routing_rules = [{"name": "pictures", "route": "missing", "images": True}]
    with pytest.raises(ValidationError) as missing:
        agent.full_clean()  # the same answer as for another tenant's route
    assert missing.value.message_dict["routing_rules"] == ["Rule 1: the tenant has no model route 'missing'."]
    RouteFactory(tenant=world.tenant, name="acme-vision")
    agent.routing_rules = [{"name": "pictures", "route": "acme-vision", "images": True}]
    agent.full_clean()


def test_the_admin_api_sets_and_checks_the_output_schema_and_rules(world, other_world):
    RouteFactory(tenant=other_world.tenant, name="theirs")
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    RouteFactory(tenant=world.tenant, name="cheap")
    client = world.client(admin=True)
    url = f"/api/v1/admin/agents/{agent.pk}/"

    bad_schema = client.patch(url, {"output_schema": {"type": "objec"}}, format="json")
    assert bad_schema.status_code == 400
    assert "Not a valid JSON Schema" in bad_schema.json()["extra"]["fields"]["output_schema"][0]
    theirs = client.patch(url, {"routing_rules": [{"name": "r", "route": "theirs", "keywords": ["x"]}]}, format="json")
    assert theirs.status_code == 400 and "no model route 'theirs'" in str(theirs.json()["extra"]["fields"])
    no_condition = client.patch(url, {"routing_rules": [{"name": "r", "route": "cheap"}]}, format="json")
    assert no_condition.status_code == 400 and "at least one condition" in str(no_condition.json())

    rules = [{"name": "money", "route": "cheap", "keywords": ["refund"]}]
    saved = client.patch(url, {"output_schema": SCHEMA, "output_repairs": 3, "routing_rules": rules}, format="json")
    assert saved.status_code == 200, saved.json()
    assert (saved.json()["output_schema"], saved.json()["output_repairs"], saved.json()["routing_rules"]) == (
        SCHEMA, 3, rules)
    agent.refresh_from_db()
    assert agent.draft_version.config["routing_rules"] == rules  # part of the version snapshot
    assert agent.draft_version.config["output_schema"] == SCHEMA
    assert client.patch(url, {"output_repairs": 6}, format="json").status_code == 400


def test_the_console_agent_form_has_the_fields(client, world):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    client.force_login(world.admin)
    page = client.get(f"/admin/agents/agentinstance/{agent.pk}/change/").content.decode()
    assert 'name="output_schema"' in page and 'name="output_repairs"' in page and 'name="routing_rules"' in page


def _claimed_spec(world, agent):
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    with tenant_scope(world.tenant.pk):
        run = message_post(session=session, user=world.member, content="hi")
        Run.all_tenants.filter(pk=run.pk).update(started_at=timezone.now())
        return run, database._spec(ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))


def test_the_claim_loads_the_rules_routes_in_the_runs_tenant_only(world, other_world):
    theirs = agent_with_route(tenant=other_world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    theirs.route.name = "vision"
    theirs.route.save()
    cheap = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:8/v1"]).route
    cheap.name = "cheap"
    cheap.save()
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:7/v1"], output_schema=SCHEMA)
    rules = [{"name": "pictures", "route": "vision", "images": True},  # another tenant's route: written past the checks
             {"name": "money", "route": "cheap", "keywords": ["refund"]}]
    AgentInstance.all_tenants.filter(pk=agent.pk).update(routing_rules=rules)
    agent.refresh_from_db()
    _, spec = _claimed_spec(world, agent)
    assert [r.name for r in spec.routing_rules] == ["money"]  # the rule naming another tenant's route is left out
    assert set(spec.routes) == {"cheap"} and spec.route_name == agent.route.name
    entries, entry_ids = spec.routes["cheap"]
    assert entry_ids == tuple(ModelRouteEntry.all_tenants.filter(route=cheap).values_list("pk", flat=True))
    assert entries[0].base_url == "http://127.0.0.1:8/v1"
    assert spec.output_schema == SCHEMA and spec.output_format["schema"] == SCHEMA

    plain = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:7/v1"], name="Plain")
    _, plain_spec = _claimed_spec(world, plain)
    assert (plain_spec.routing_rules, plain_spec.routes, plain_spec.output_format) == ((), None, None)


def _entry(**fields) -> RouteEntryConfig:
    return RouteEntryConfig(index=0, provider_name="p", base_url="http://x/v1", api_key="", model="m",
                            max_input_tokens=1000, max_output_tokens=100, connect_timeout_seconds=1,
                            read_timeout_seconds=1, **fields)


def test_native_json_schema_mode_sends_the_format_only_where_it_cannot_stop_a_tool_call():
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": False}}
    messages = [ChatMessage(role="user", content="hi")]
    tool = ToolSpec(name="search", description="d", parameters={"type": "object", "properties": {}})
    params, _ = build_request(_entry(json_schema_mode=True), messages, [tool], response_format=fmt)
    assert params["response_format"] == fmt and params["tools"]  # native tool calls: both
    params, _ = build_request(_entry(), messages, [], response_format=fmt)
    assert "response_format" not in params  # the entry has no native mode: prompted only
    params, _ = build_request(_entry(json_schema_mode=True, tool_calls="text"), messages, [tool], response_format=fmt)
    assert "response_format" not in params  # text-mode calls are text: a schema would forbid them
    params, _ = build_request(_entry(json_schema_mode=True, tool_calls="text"), messages, [], response_format=fmt)
    assert params["response_format"] == fmt


def test_the_trace_shows_the_route_chosen_to_admins_only(world):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    run, _ = _claimed_spec(world, agent)
    Run.all_tenants.filter(pk=run.pk).update(routing=[{"turn": 0, "rule": "money", "route": "cheap"}])
    run = Run.all_tenants.get(pk=run.pk)
    admin = run_trace(run=run, admin=True)
    assert admin["run"]["routing"] == [{"turn": 0, "rule": "money", "route": "cheap"}]
    member = run_trace(run=run, admin=False)
    assert "routing" not in member["run"]
