"""Agents as code: export to YAML and import back (``agents_export`` / ``agents_import``)."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
import yaml
from django.core.management import CommandError, call_command

from agents.models import AgentInstance, AgentVersion, CapabilityBinding
from agents.tests.factories import AgentFactory, RouteFactory
from agents.versions import AGENT_EXCLUDED, BINDING_EXCLUDED, agent_config, config_fields
from capabilities.models import McpServer, Skill
from capabilities.tests.test_cli_models import command

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

AGENT_VALUES = {
    "name": "Round Trip",
    "slug": "round-trip",
    "description": "Tests every field.",
    "system_prompt": "Line one.\nLine two: «quoted» — and 'ticks'.",
    "max_loop_count": 7,
    "tool_max_parallel": 2,
    "tool_timeout_seconds": 12.5,
    "turn_timeout_seconds": 99.0,
    "run_timeout_seconds": 600.0,
    "message_mode": "steer",
    "max_tokens_per_run": 1234,
    "max_cost_per_run_usd": Decimal("1.250000"),
    "is_active": False,
    "a2a_public": True,
    "output_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "output_repairs": 4,
    "routing_rules": [{"name": "pictures", "route": "main-route", "images": True, "keywords": ["photo"]}],
}
"""A value, not the default, for every configuration field but ``route`` (set separately)."""


def _export(**options: str) -> str:
    out = io.StringIO()
    call_command("agents_export", stdout=out, **options)
    return out.getvalue()


def _import(path, *args: str) -> str:
    out = io.StringIO()
    call_command("agents_import", str(path), *args, stdout=out)
    return out.getvalue()


def _agent_with_every_field(tenant) -> AgentInstance:
    route = RouteFactory(tenant=tenant, name="main-route")
    agent = AgentFactory(tenant=tenant, route=route, **AGENT_VALUES)
    server = McpServer.all_tenants.create(
        tenant=tenant, name="github", alias="gh", transport="streamable_http", url="https://mcp.example.com/mcp"
    )
    skill = Skill.all_tenants.create(tenant=tenant, name="summarise", description="d", instructions="i")
    cli = command(tenant, name="factor")
    make = CapabilityBinding.all_tenants.create
    make(
        tenant=tenant,
        agent=agent,
        kind="mcp_server",
        mcp_server=server,
        allowed_tools=["search"],
        approval_policy=[{"pattern": "delete_*", "action": "ask"}],
        config={"log_level": "info", "sampling": {"allowed": True, "allow_tools": False, "max_tokens": 512}},
        enabled=False,
    )
    make(tenant=tenant, agent=agent, kind="builtin", builtin_name="todo_write")
    make(tenant=tenant, agent=agent, kind="cli", cli_command=cli)
    make(tenant=tenant, agent=agent, kind="skill", skill=skill)
    return AgentInstance.all_tenants.get(pk=agent.pk)


def test_the_fixture_sets_every_configuration_field():
    """A new field of AgentInstance or CapabilityBinding fails here until the round trip below
    gives it a value (and so checks it survives export and import)."""
    agent_fields = {f.name for f in config_fields(AgentInstance, AGENT_EXCLUDED)}
    assert agent_fields == {*AGENT_VALUES, "route"}
    for name, value in AGENT_VALUES.items():
        assert value != AgentInstance._meta.get_field(name).get_default(), (
            f"{name}: use a value that is not the default"
        )
    binding_fields = {f.name for f in config_fields(CapabilityBinding, BINDING_EXCLUDED)}
    assert binding_fields == {
        "kind",
        "mcp_server",
        "builtin_name",
        "cli_command",
        "skill",
        "allowed_tools",
        "approval_policy",
        "config",
        "enabled",
    }, "give a new binding field a value in the fixture"


def test_a_round_trip_is_lossless_on_every_field(world, tmp_path):
    agent = _agent_with_every_field(world.tenant)
    original = agent_config(agent)
    assert all(original[f.name] not in (None, "", [], {}) for f in config_fields(AgentInstance, AGENT_EXCLUDED))
    text = _export(tenant=world.tenant.slug)
    assert "secret" not in text.lower() and "env" not in yaml.safe_load(text)["agents"][0]
    path = tmp_path / "agents.yaml"
    path.write_text(text)
    # Everything changed or gone, then imported back.
    CapabilityBinding.all_tenants.filter(agent=agent).delete()
    AgentInstance.all_tenants.filter(pk=agent.pk).update(system_prompt="changed", max_loop_count=1, is_active=True)
    agent = AgentInstance.all_tenants.get(pk=agent.pk)
    agent.save()
    versions_before = AgentVersion.all_tenants.filter(agent=agent).count()
    report = _import(path)
    agent = AgentInstance.all_tenants.get(pk=agent.pk)
    assert agent_config(agent) == original
    for name, value in AGENT_VALUES.items():
        assert getattr(agent, name) == value, name
    assert AgentVersion.all_tenants.filter(agent=agent).count() == versions_before + 1, "one import, one version"
    assert "acme/round-trip: " in report and "Imported 1 agent(s)." in report
    assert _export(tenant=world.tenant.slug) == text, "export → import → export gives the same document"


def test_a_dry_run_prints_the_diff_and_writes_nothing(world, tmp_path):
    agent = _agent_with_every_field(world.tenant)
    doc = yaml.safe_load(_export(tenant=world.tenant.slug, agent="round-trip"))
    doc["agents"][0]["system_prompt"] = "A new prompt."
    doc["agents"].append({**doc["agents"][0], "slug": "copy", "name": "Copy"})
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(doc))
    versions = AgentVersion.all_tenants.count()
    report = _import(path, "--dry-run")
    assert "acme/round-trip: 1 field(s) change" in report and "+A new prompt." in report
    assert "acme/copy: new agent" in report and "Dry run: nothing written." in report
    assert AgentVersion.all_tenants.count() == versions and not AgentInstance.all_tenants.filter(slug="copy").exists()
    assert AgentInstance.all_tenants.get(pk=agent.pk).system_prompt == AGENT_VALUES["system_prompt"]
    _import(path)
    assert AgentInstance.all_tenants.get(pk=agent.pk).system_prompt == "A new prompt."
    assert CapabilityBinding.all_tenants.filter(agent__slug="copy").count() == 4


def test_an_import_naming_what_the_tenant_lacks_is_refused_whole(world, other_world, tmp_path):
    _agent_with_every_field(world.tenant)
    doc = yaml.safe_load(_export(tenant=world.tenant.slug))
    doc["agents"][0]["tenant"] = other_world.tenant.slug  # their tenant has no route "main-route"
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CommandError, match="no route 'main-route'"):
        _import(path)
    assert not AgentInstance.all_tenants.filter(tenant=other_world.tenant).exists()
    path.write_text("agents: 3")
    with pytest.raises(CommandError, match="list `agents`"):
        _import(path)


def test_the_console_exports_its_tenants_agents_and_imports_with_a_preview(world, other_world):
    from django.test import Client
    from django.urls import reverse

    _agent_with_every_field(world.tenant)
    AgentFactory(tenant=other_world.tenant, name="Theirs", slug="theirs")
    client = Client()
    client.force_login(world.admin)
    assert (
        reverse("admin:agents_agentinstance_export")
        in client.get(reverse("admin:agents_agentinstance_changelist")).content.decode()
    )
    resp = client.get(reverse("admin:agents_agentinstance_export"))
    assert resp.status_code == 200 and resp["Content-Disposition"] == 'attachment; filename="agents.yaml"'
    doc = yaml.safe_load(resp.content)
    assert [a["slug"] for a in doc["agents"]] == ["round-trip"], "only the admin's own tenant's agents"
    doc["agents"][0]["system_prompt"] = "From the console."
    text = yaml.safe_dump(doc)
    url = reverse("admin:agents_agentinstance_import")
    html = client.post(url, {"text": text, "preview": "1"}).content.decode()
    assert "Preview: nothing written yet" in html and "+From the console." in html
    assert AgentInstance.all_tenants.get(slug="round-trip").system_prompt == AGENT_VALUES["system_prompt"]
    html = client.post(url, {"text": text, "apply": "1"}).content.decode()
    assert "Imported" in html
    agent = AgentInstance.all_tenants.get(slug="round-trip")
    assert agent.system_prompt == "From the console."
    assert agent.draft_version.created_by == world.admin and agent.draft_version.note == "Imported in the console"
    # Another tenant named in the file is refused as unknown; nothing of theirs changes.
    theirs_doc = {"agents": [{**doc["agents"][0], "tenant": other_world.tenant.slug, "slug": "theirs"}]}
    html = client.post(url, {"text": yaml.safe_dump(theirs_doc), "apply": "1"}).content.decode()
    assert f"No tenant &#x27;{other_world.tenant.slug}&#x27;" in html
    assert AgentInstance.all_tenants.get(slug="theirs").system_prompt != "From the console."
