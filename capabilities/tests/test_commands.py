"""Tenant slash commands (issue 37): written in the console and through the admin API (bad
arguments and a name taken in the tenant are refused with the field named), bound to agents
with a binding of kind ``command`` (which offers a run nothing)."""

from __future__ import annotations

import json

import pytest

from agents.models import CapabilityBinding
from agents.tests.factories import AgentFactory
from capabilities.commands.models import Command
from capabilities.registry import binding_specs

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

ARGUMENTS = [{"name": "language", "description": "Into which language.", "required": True}]


def test_console_writes_a_command_and_shows_where_it_is_bound(client, world, other_world):
    client.force_login(world.admin)
    assert client.get("/admin/capabilities/command/add/").status_code == 200
    form = {"name": "translate", "description": "Translate a text.", "template": "Into $language:\n\n$ARGUMENTS",
            "arguments": json.dumps(ARGUMENTS)}
    resp = client.post("/admin/capabilities/command/add/", form)
    assert resp.status_code == 302, resp.content.decode()[:3000]
    command = Command.all_tenants.get(name="translate")
    assert command.tenant_id == world.tenant.pk and command.arguments == ARGUMENTS
    again = client.post("/admin/capabilities/command/add/", form).content.decode()
    assert "The tenant already has a command named /translate." in again
    bad = client.post("/admin/capabilities/command/add/", {**form, "name": "other", "arguments": '[{"name": "ARGUMENTS"}]'})
    assert bad.status_code == 200 and "ARGUMENTS is reserved" in bad.content.decode()
    agent = AgentFactory(tenant=world.tenant, name="Writer")
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind="command", config={"command": command.pk})
    page = client.get(f"/admin/capabilities/command/{command.pk}/change/").content.decode()
    assert "Writer" in page
    theirs = Command.all_tenants.create(tenant=other_world.tenant, name="theirs", template="secret")
    listing = client.get("/admin/capabilities/command/").content.decode()
    assert "translate" in listing and "theirs" not in listing
    assert client.get(f"/admin/capabilities/command/{theirs.pk}/change/").status_code == 302


def test_admin_api_writes_commands_with_clear_errors(world):
    client = world.client(admin=True)
    body = {"name": "translate", "description": "Translate.", "template": "Into $language", "arguments": ARGUMENTS}
    resp = client.post("/api/v1/admin/commands/", body, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["arguments"] == ARGUMENTS
    assert client.post("/api/v1/admin/commands/", body, format="json").status_code == 400
    resp = client.post("/api/v1/admin/commands/", {**body, "name": "Bad Name"}, format="json")
    assert resp.status_code == 400 and "name" in resp.json()["extra"]["fields"]
    resp = client.post("/api/v1/admin/commands/", {**body, "name": "twice", "arguments": ARGUMENTS * 2}, format="json")
    assert resp.status_code == 400 and resp.json()["extra"]["fields"]["arguments"] == [
        "Argument 'language' is declared twice."]
    assert world.client().get("/api/v1/admin/commands/").status_code == 403


def test_a_command_binding_offers_a_run_nothing(world):
    agent = AgentFactory(tenant=world.tenant)
    command = Command.all_tenants.create(tenant=world.tenant, name="hello", template="Hello")
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "command",
                                                   "config": {"command": command.pk}}, format="json")
    assert resp.status_code == 201, resp.content
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "command", "config": {}}, format="json")
    assert resp.status_code == 400 and "config" in resp.json()["extra"]["fields"]
    bindings = list(CapabilityBinding.all_tenants.filter(agent=agent))
    assert binding_specs(bindings) == ()


def test_seed_demo_binds_a_command_to_the_assistant() -> None:
    from django.core.management import call_command

    call_command("seed_demo")
    call_command("seed_demo")  # idempotent
    [command] = Command.all_tenants.filter(tenant__slug="demo")
    [binding] = CapabilityBinding.all_tenants.filter(kind="command", config={"command": command.pk})
    assert binding.agent.name == "Assistant" and command.name == "time-in"
