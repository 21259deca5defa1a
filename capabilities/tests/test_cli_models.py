"""CliCommand rows (catalogue templates enabled for a tenant), their bindings, the console and
the demo: validation, tenancy, secrets, and what a tenant admin can no longer write."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone

from agents.models import AgentInstance, CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory
from capabilities.confinement import bwrap_resolve
from capabilities.models import CliCommand
from capabilities.tests.catalogue import cli_template
from sessions.models import ChatSession, Run
from sessions.runner.adapters import run_spec_load
from sessions.runs import ClaimedRun
from tenants.crypto import secret_decrypt_json, secret_encrypt_json
from tenants.models import Tenant
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

FACTOR_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}


def factor_template():
    return cli_template("factor", ["factor", "--", "{n}"], FACTOR_SCHEMA, timeout_seconds=30)


def command(tenant, **fields) -> CliCommand:
    values = {"name": "factor"}
    values.update(fields)
    if "template" not in values:
        values["template"] = factor_template()
    row = CliCommand(tenant=tenant, **values)
    row.full_clean()
    row.save()
    return row


def test_defaults_and_validation(world) -> None:
    row = command(world.tenant)
    assert (row.timeout_seconds, row.max_output_bytes, row.enabled, row.parameters) == (30.0, 65536, True, {})
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="bad name!", template=row.template)
    assert "name" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="no-template", template=None)
    assert caught.value.message_dict["template"] == ["Choose a program from the operator's catalogue."]
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, name="slow", template=row.template, timeout_seconds=60)
    assert caught.value.message_dict["timeout_seconds"] == ["At most the template's 30 s."]
    with pytest.raises(ValidationError):
        command(world.tenant, template=row.template)  # the name is unique per tenant


def test_template_rules_are_the_operators(world) -> None:
    from capabilities.tests.catalogue import template

    with pytest.raises(ValidationError) as caught:
        cli_template("bad-program", ["{n}"], FACTOR_SCHEMA)
    assert "Element 0 is the program" in caught.value.message_dict["argv"][0]
    with pytest.raises(ValidationError) as caught:
        cli_template("bad-placeholder", ["echo", "{x}"], FACTOR_SCHEMA)
    assert "not a property" in caught.value.message_dict["argv"][0]
    with pytest.raises(ValidationError) as caught:
        cli_template("bad-param", ["echo", "${NOPE}"])
    assert caught.value.message_dict["argv"] == ["${NOPE} is not a declared tenant parameter."]
    with pytest.raises(ValidationError) as caught:
        template("bad-bind", kind="cli", argv=["true"], ro_binds=["/root/.ssh"])
    assert "may not be bound" in caught.value.message_dict["ro_binds"][0]
    with pytest.raises(ValidationError) as caught:
        template("bad-net", kind="cli", argv=["true"], network="host")
    assert "network" in caught.value.message_dict


def test_a_template_offered_to_other_tenants_only_is_refused(world, other_world) -> None:
    private = factor_template()
    private.tenants.set([other_world.tenant])
    with pytest.raises(ValidationError) as caught:
        command(world.tenant, template=private)
    assert caught.value.message_dict["template"] == ["This template is not available to the tenant."]
    assert command(other_world.tenant, template=private).template == private


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


def test_the_run_spec_carries_the_command_with_its_env_decrypted(world, settings) -> None:
    template = cli_template("lookup", ["lookup", "--", "{n}"], FACTOR_SCHEMA, network="egress",
                            secrets=["TOKEN"], env={"MODE": "fixed"}, ro_binds=["/opt/tools"])
    row = command(world.tenant, template=template, timeout_seconds=5, max_output_bytes=100)
    row.env_encrypted = secret_encrypt_json(tenant=world.tenant, value={"TOKEN": "t-1", "NOT_DECLARED": "x"})
    row.save()
    disabled = command(world.tenant, name="disabled", template=template, enabled=False)
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
        spec = run_spec_load(ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
    [cli] = spec.bindings_of("cli")
    profile = cli.command.profile
    assert dict(profile.env) == {"TOKEN": "t-1", "MODE": "fixed"}, "only declared secrets, plus the fixed env"
    assert cli.command.argv_template == ("lookup", "--", "{n}") and cli.command.parameters_schema == FACTOR_SCHEMA
    assert (cli.command.timeout_seconds, cli.command.max_output_bytes, profile.network) == (5, 100, "egress")
    assert profile.ro_binds == (*settings.SANDBOX_RO_BINDS, "/opt/tools") and profile.uid == settings.SANDBOX_UID
    assert cli.approval_policy == ({"pattern": "*", "action": "ask"},) and cli.binding_id is not None


def test_console_env_is_a_write_only_encrypted_secret(client, world, other_world) -> None:
    client.force_login(world.admin)
    template = cli_template("printenv", ["printenv", "API_TOKEN"], secrets=["API_TOKEN"])
    form = {
        "name": "lookup", "description": "d", "template": str(template.pk), "parameters": "{}",
        "timeout_seconds": "30", "max_output_bytes": "65536", "env": json.dumps({"API_TOKEN": "console-secret-123"}),
        "enabled": "on",
    }
    resp = client.post("/admin/capabilities/clicommand/add/", form)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    row = CliCommand.all_tenants.get(name="lookup")
    assert row.tenant_id == world.tenant.pk and row.template_id == template.pk
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
    bad = client.post("/admin/capabilities/clicommand/add/", {**form, "name": "bad", "env": '{"OTHER": "x"}'})
    assert bad.status_code == 200 and "is not a secret of" in bad.content.decode()

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
    assert researcher.route.name == "local"  # the 0.5B's route (console/tests/test_seed_demo_routes.py)
    [binding] = CapabilityBinding.all_tenants.filter(agent=researcher, kind=CapabilityKind.CLI)
    assert binding.kind == CapabilityKind.CLI and binding.cli_command.name == "factor"
    factor = binding.cli_command
    assert factor.template.slug == "factor" and factor.template.network == "none"
    assert CliCommand.all_tenants.filter(tenant=tenant).count() == 1

    from capabilities.cli.tool import CliTool
    from capabilities.services import cli_command_config
    from capabilities.tools import ToolContext

    with tenant_scope(tenant.pk):
        tool = CliTool(cli_command_config(command=factor))
    result = asyncio.run(tool.execute({"n": 360}, ToolContext(tenant_id=tenant.pk, session_id=0, run_id=0,
                                                              tool_call_id=0)))
    assert result.content == "exit code 0\n--- stdout ---\n360: 2 2 2 3 3 5"


def test_console_offers_no_command_line_and_no_unsandboxed_switch(client, world) -> None:
    """Attack C2: a tenant admin ticked ``unsandboxed`` (or wrote an argv) in the console. The
    form has neither any more; posted anyway, they are ignored, and the template decides."""
    template = factor_template()
    client.force_login(world.admin)
    page = client.get("/admin/capabilities/clicommand/add/").content.decode()
    for field in ("unsandboxed", "argv_template", "allow_network", "parameters_schema"):
        assert f'name="{field}"' not in page, field
    resp = client.post("/admin/capabilities/clicommand/add/", {
        "name": "evil", "template": str(template.pk), "parameters": "{}", "timeout_seconds": "30",
        "max_output_bytes": "65536", "enabled": "on", "unsandboxed": "on",
        "argv_template": json.dumps(["python3", "-c", "import os; os.system('id')"]),
    })
    assert resp.status_code == 302, resp.content.decode()[:1500]
    with tenant_scope(world.tenant.pk):
        from capabilities.services import cli_command_config

        config = cli_command_config(command=CliCommand.objects.get(name="evil"))
    assert config.argv_template == ("factor", "--", "{n}") and config.profile.network == "none"


def test_tenant_admins_read_the_catalogue_but_only_operators_write_it(client, world, admin_user) -> None:
    template = factor_template()
    client.force_login(world.admin)
    assert client.get("/admin/capabilities/programtemplate/").status_code == 200
    assert client.get(f"/admin/capabilities/programtemplate/{template.pk}/change/").status_code == 200
    assert client.get("/admin/capabilities/programtemplate/add/").status_code == 403
    resp = client.post(f"/admin/capabilities/programtemplate/{template.pk}/change/", {
        "slug": "factor", "name": "x", "kind": "cli", "argv": '["sh", "-c", "{n}"]', "network": "egress",
    })
    assert resp.status_code == 403
    template.refresh_from_db()
    assert template.argv == ["factor", "--", "{n}"]
    assert client.post(f"/admin/capabilities/programtemplate/{template.pk}/delete/", {"post": "yes"}).status_code == 403

    client.force_login(admin_user)  # a superuser: the platform operator
    assert client.get("/admin/capabilities/programtemplate/add/").status_code == 200
