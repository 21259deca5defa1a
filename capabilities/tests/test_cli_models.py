"""CliCommand rows, their bindings, the console and the demo: validation, tenancy, secrets."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone

from agents.models import AgentInstance, CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory
from capabilities.cli.sandbox import bwrap_resolve
from capabilities.models import CliCommand
from sessions.runner._db import ClaimedRun, _spec
from sessions.models import ChatSession, Run
from tenants.crypto import secret_decrypt_json, secret_encrypt_json
from tenants.models import Tenant
from tenants.scoping import tenant_scope

pytestmark = pytest.mark.django_db

FACTOR_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}


def command(tenant, **fields) -> CliCommand:
    values = {"name": "factor", "argv_template": ["factor", "--", "{n}"], "parameters_schema": FACTOR_SCHEMA}
    values.update(fields)
    row = CliCommand(tenant=tenant, **values)
    row.full_clean()
    row.save()
    return row


def test_defaults_and_validation(world) -> None:
    row = command(world.tenant)
    assert (row.timeout_seconds, row.max_output_bytes, row.allow_network, row.unsandboxed, row.enabled) == (
        30.0, 65536, False, False, True)
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="bad name!")
    assert "name" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="echo", argv_template=["{n}"])
    assert caught.value.message_dict["argv_template"] == ["Element 0 (the program) may not contain a placeholder."]
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="echo2", argv_template=["echo", "{x}"])
    assert "not a property" in caught.value.message_dict["argv_template"][0]
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="echo3", parameters_schema={"type": "object", "properties": {"n": {"type": "array"}}})
    assert "parameters_schema" in caught.value.message_dict
    with pytest.raises(ValidationError):
        command(world.tenant)  # the name is unique per tenant


def test_the_same_name_may_exist_in_two_tenants(world, other_world) -> None:
    command(world.tenant)
    command(other_world.tenant)
    assert CliCommand.all_tenants.filter(name="factor").count() == 2


def test_a_binding_needs_a_command_of_its_own_tenant(world, other_world) -> None:
    agent = AgentFactory(tenant=world.tenant)
    theirs = command(other_world.tenant)
    binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.CLI)
    with pytest.raises(ValidationError) as caught:
        binding.full_clean()
    assert caught.value.message_dict["cli_command"] == ["Choose a CLI command."]
    binding.cli_command = theirs
    with pytest.raises(ValidationError) as caught:
        binding.full_clean()
    assert caught.value.message_dict["cli_command"] == ["CLI command not found."]
    binding.cli_command = command(world.tenant)
    binding.full_clean()
    binding.save()
    assert str(binding) == f"{agent.name} → factor"


def test_the_bindings_api_accepts_own_commands_and_hides_other_tenants(world, other_world) -> None:
    client = world.client(admin=True)
    agent = AgentFactory(tenant=world.tenant)
    theirs = command(other_world.tenant)
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "cli", "cli_command": theirs.pk},
                       format="json")
    assert resp.status_code == 400 and "cli_command" in resp.json()["extra"]["fields"]
    missing = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "cli", "cli_command": 999999},
                          format="json")
    assert missing.json()["extra"]["fields"]["cli_command"] == [
        m.replace(f'"{theirs.pk}"', '"999999"') for m in resp.json()["extra"]["fields"]["cli_command"]
    ], "another tenant's command looks exactly like a missing one"
    mine = command(world.tenant)
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "cli", "cli_command": mine.pk},
                       format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["cli_command"] == mine.pk


def test_the_run_spec_carries_the_command_with_its_env_decrypted(world) -> None:
    row = command(world.tenant, timeout_seconds=5, max_output_bytes=100, allow_network=True)
    row.env_encrypted = secret_encrypt_json(tenant=world.tenant, value={"TOKEN": "t-1"})
    row.save()
    disabled = command(world.tenant, name="disabled", enabled=False)
    agent = AgentFactory(tenant=world.tenant)
    from agents.tests.factories import RouteEntryFactory

    RouteEntryFactory(tenant=world.tenant, route=agent.route)
    for cmd in (row, row, disabled):  # bound twice: offered once
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.CLI, cli_command=cmd,
                                             approval_policy=[{"pattern": "*", "action": "ask"}])
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="x",
                                 started_at=timezone.now())
    with tenant_scope(world.tenant.pk):
        spec = _spec(ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
    [cli] = spec.cli_bindings
    assert cli.command.env == {"TOKEN": "t-1"}
    assert cli.command.argv_template == ("factor", "--", "{n}") and cli.command.parameters_schema == FACTOR_SCHEMA
    assert (cli.command.timeout_seconds, cli.command.max_output_bytes, cli.command.allow_network) == (5, 100, True)
    assert cli.approval_policy == ({"pattern": "*", "action": "ask"},) and cli.binding_id is not None


def test_console_env_is_a_write_only_encrypted_secret(client, world, other_world) -> None:
    client.force_login(world.admin)
    form = {
        "name": "lookup", "description": "d", "argv_template": json.dumps(["printenv", "API_TOKEN"]),
        "parameters_schema": json.dumps({"type": "object", "properties": {}}), "timeout_seconds": "30",
        "max_output_bytes": "65536", "env": json.dumps({"API_TOKEN": "console-secret-123"}), "enabled": "on",
    }
    resp = client.post("/admin/capabilities/clicommand/add/", form)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    row = CliCommand.all_tenants.get(name="lookup")
    assert row.tenant_id == world.tenant.pk and not row.unsandboxed, "unsandboxed only when ticked"
    assert "console-secret-123" not in row.env_encrypted
    assert secret_decrypt_json(tenant=Tenant.objects.get(pk=world.tenant.pk), ciphertext=row.env_encrypted) == {
        "API_TOKEN": "console-secret-123"}
    page = client.get(f"/admin/capabilities/clicommand/{row.pk}/change/").content.decode()
    assert "console-secret-123" not in page and row.env_encrypted not in page

    form_keep = {**form, "env": "", "description": "changed"}
    assert client.post(f"/admin/capabilities/clicommand/{row.pk}/change/", form_keep).status_code == 302
    row.refresh_from_db()
    assert row.description == "changed" and row.env_encrypted, "blank keeps the stored env"

    bad = client.post("/admin/capabilities/clicommand/add/", {**form, "name": "bad", "env": '{"A-B": "x"}'})
    assert bad.status_code == 200 and "Not valid variable names: A-B" in bad.content.decode()
    bad = client.post("/admin/capabilities/clicommand/add/",
                      {**form, "name": "bad", "argv_template": json.dumps(["echo", "{nope}"])})
    assert bad.status_code == 200 and "is not a property of the parameter schema" in bad.content.decode()

    theirs = command(other_world.tenant)
    listing = client.get("/admin/capabilities/clicommand/").content.decode()
    assert "lookup" in listing and f"/clicommand/{theirs.pk}/" not in listing
    foreign = client.get(f"/admin/capabilities/clicommand/{theirs.pk}/change/", follow=True)
    assert foreign.status_code == 200 and "doesn’t exist" in foreign.content.decode()


@pytest.mark.skipif(bwrap_resolve("bwrap") is None, reason="bubblewrap is not installed")
def test_seed_demo_binds_a_sandboxed_factor_command_to_a_second_agent() -> None:
    call_command("seed_demo")
    call_command("seed_demo")  # idempotent
    tenant = Tenant.objects.get(slug="demo")
    researcher = AgentInstance.all_tenants.get(tenant=tenant, name="Researcher")
    assistant = AgentInstance.all_tenants.get(tenant=tenant, name="Assistant")
    assert researcher.route_id == assistant.route_id
    [binding] = CapabilityBinding.all_tenants.filter(agent=researcher, kind=CapabilityKind.CLI)
    assert binding.kind == CapabilityKind.CLI and binding.cli_command.name == "factor"
    factor = binding.cli_command
    assert not factor.unsandboxed and not factor.allow_network
    assert CliCommand.all_tenants.filter(tenant=tenant).count() == 1

    from capabilities.cli.tool import CliCommandConfig, CliTool
    from capabilities.tools import ToolContext

    tool = CliTool(CliCommandConfig(
        name=factor.name, description=factor.description, argv_template=tuple(factor.argv_template),
        parameters_schema=factor.parameters_schema, timeout_seconds=factor.timeout_seconds,
        max_output_bytes=factor.max_output_bytes,
    ))
    result = asyncio.run(tool.execute({"n": 360}, ToolContext(tenant_id=tenant.pk, session_id=0, run_id=0,
                                                              tool_call_id=0)))
    assert result.content == "exit code 0\n--- stdout ---\n360: 2 2 2 3 3 5"
