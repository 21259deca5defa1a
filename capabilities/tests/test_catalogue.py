"""The operator catalogue through the admin API and ``catalogue_import``: tenant admins choose
programs, they never write one (issue 23, C1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from capabilities.catalogue import ProgramTemplate
from capabilities.models import McpServer
from capabilities.services import catalogue_import, mcp_server_config
from capabilities.tests.catalogue import template, time_template
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_tenant_admin_cannot_create_a_stdio_server_with_a_command(world) -> None:
    """Attack C1: ``POST /api/v1/admin/mcp-servers/ {"transport": "stdio", "command": "<python>",
    "args": ["evil.py"]}`` made the worker run any program. Now a stdio server is a template."""
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/mcp-servers/", {
        "name": "evil", "alias": "evil", "transport": "stdio", "command": sys.executable, "args": ["evil.py"],
    }, format="json")
    assert resp.status_code == 400, resp.json()
    assert resp.json()["extra"]["fields"]["template"] == [
        "A stdio server is a program from the operator's catalogue: choose one."]
    assert not McpServer.all_tenants.filter(alias="evil").exists()


def test_a_tenant_admin_enables_a_template_with_parameters_and_secrets(world) -> None:
    time_template()
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/mcp-servers/", {
        "name": "Time", "alias": "time", "transport": "stdio", "template": "mcp-server-time",
        "parameters": {"TIMEZONE": "Asia/Tokyo"},
    }, format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["template"] == "mcp-server-time" and body["parameters"] == {"TIMEZONE": "Asia/Tokyo"}
    assert "command" not in body and "args" not in body
    server = McpServer.all_tenants.get(pk=body["id"])
    with tenant_scope(world.tenant.pk):
        config = mcp_server_config(server=server)
    assert config.sandbox is not None and config.sandbox.network == "none"
    assert config.args[-2:] == ("--local-timezone", "Asia/Tokyo")


@pytest.mark.parametrize("value", ["UTC --help", "$(id)", "a;b", "x" * 100, "{n}"])
def test_parameter_values_must_match_their_pattern(world, value: str) -> None:
    time_template()
    resp = world.client(admin=True).post("/api/v1/admin/mcp-servers/", {
        "name": "Time", "alias": "time", "transport": "stdio", "template": "mcp-server-time",
        "parameters": {"TIMEZONE": value},
    }, format="json")
    assert resp.status_code == 400 and "parameters" in resp.json()["extra"]["fields"], resp.json()


def test_secrets_are_only_the_templates_names(world) -> None:
    template("with-secret", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x"], secrets=["API_TOKEN"])
    client = world.client(admin=True)
    bad = client.post("/api/v1/admin/mcp-servers/", {
        "name": "S", "alias": "s", "transport": "stdio", "template": "with-secret",
        "env": {"LD_PRELOAD": "/tmp/evil.so"},
    }, format="json")
    assert bad.status_code == 400 and "is not a secret of 'with-secret'" in str(bad.json()["extra"]), bad.json()
    good = client.post("/api/v1/admin/mcp-servers/", {
        "name": "S", "alias": "s", "transport": "stdio", "template": "with-secret", "env": {"API_TOKEN": "t"},
    }, format="json")
    assert good.status_code == 201, good.json()
    with tenant_scope(world.tenant.pk):
        config = mcp_server_config(server=McpServer.objects.get(alias="s"))
    assert dict(config.sandbox.env) == {"API_TOKEN": "t"}, "the secrets are the sandbox's environment, nothing else"


def test_the_catalogue_api_lists_what_the_tenant_may_enable_and_is_read_only(world, other_world) -> None:
    time_template()
    private = template("theirs-only", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x"])
    private.tenants.set([other_world.tenant])
    template("switched-off", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x"], enabled=False)
    client = world.client(admin=True)
    resp = client.get("/api/v1/admin/program-templates/")
    assert resp.status_code == 200
    rows = resp.json()["results"] if isinstance(resp.json(), dict) else resp.json()
    assert [r["slug"] for r in rows] == ["mcp-server-time"]
    assert client.get("/api/v1/admin/program-templates/theirs-only/").status_code == 404
    assert client.post("/api/v1/admin/program-templates/", {"slug": "x"}, format="json").status_code == 405
    assert world.client().get("/api/v1/admin/program-templates/").status_code == 403, "members do not"
    theirs = other_world.client(admin=True).get("/api/v1/admin/program-templates/").json()
    theirs = theirs["results"] if isinstance(theirs, dict) else theirs
    assert sorted(r["slug"] for r in theirs) == ["mcp-server-time", "theirs-only"]

    resp = client.post("/api/v1/admin/mcp-servers/", {
        "name": "T", "alias": "t", "transport": "stdio", "template": "theirs-only"}, format="json")
    assert resp.status_code == 400 and "template" in resp.json()["extra"]["fields"]


def test_an_http_server_has_no_template_and_no_secrets(world) -> None:
    time_template()
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/mcp-servers/", {
        "name": "W", "alias": "w", "transport": "streamable_http", "url": "https://mcp.example.com/mcp",
        "template": "mcp-server-time"}, format="json")
    assert resp.status_code == 400 and resp.json()["extra"]["fields"]["template"] == [
        "Only a stdio server has a template."]


def test_the_shipped_catalogue_imports_and_is_idempotent() -> None:
    call_command("catalogue_import", str(REPO_ROOT / "deploy" / "catalogue.yaml"))
    call_command("catalogue_import", str(REPO_ROOT / "deploy" / "catalogue.yaml"))
    rows = {t.slug: t for t in ProgramTemplate.objects.all()}
    assert {"mcp-server-time", "mcp-server-fetch", "factor"} <= set(rows)
    assert rows["mcp-server-fetch"].network == "egress" and rows["mcp-server-time"].network == "none"
    assert rows["factor"].kind == "cli" and rows["factor"].argv == ["factor", "--", "{n}"]


def test_a_bad_catalogue_writes_nothing(tmp_path) -> None:
    path = tmp_path / "catalogue.yaml"
    path.write_text(yaml.safe_dump({"templates": [
        {"slug": "good", "name": "Good", "kind": "cli", "argv": ["true"]},
        {"slug": "bad", "name": "Bad", "kind": "cli", "argv": ["sh"], "ro_binds": ["/etc"]},
    ]}))
    with pytest.raises(CommandError) as caught:
        call_command("catalogue_import", str(path))
    assert "bad" in str(caught.value) and "may not be bound" in str(caught.value)
    assert not ProgramTemplate.objects.filter(slug__in=["good", "bad"]).exists(), "all or nothing"
    with pytest.raises(ValidationError):
        catalogue_import(data={"templates": [{"slug": "x", "kind": "cli", "argv": ["true"], "command": "sh"}]})


# --- tenant parameters: no option injection, no paths into the kernel's or the platform's files ---


def _create(world, template_slug: str, parameters: dict[str, str], *, transport: str = "stdio"):
    return world.client(admin=True).post("/api/v1/admin/mcp-servers/", {
        "name": "P", "alias": "p", "transport": transport, "template": template_slug, "parameters": parameters,
    }, format="json")


@pytest.mark.parametrize("value", ["--help", "-h", "--", "--local-timezone", "-/etc"])
def test_a_parameter_value_that_would_be_read_as_an_option_is_refused(world, value: str) -> None:
    """Issue 34 (low): ``TIMEZONE=--help`` matched the template's pattern and reached the program
    as an option. Like a model's argument (capabilities/cli/template.py), a tenant's value may not
    start an element with '-'."""
    time_template()
    resp = _create(world, "mcp-server-time", {"TIMEZONE": value})
    assert resp.status_code == 400, resp.json()
    [message] = resp.json()["extra"]["fields"]["parameters"]
    assert message.startswith("TIMEZONE: ") and "may not start with '-'" in message, message
    assert not McpServer.all_tenants.filter(alias="p").exists()


def test_a_dash_is_fine_where_it_cannot_start_an_option(world) -> None:
    """The model's rule: inside an element (``--offset=${N}``) or after a literal ``--``."""
    template("dashes", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x", "--offset=${OFFSET}", "--", "${NAME}"],
             tenant_parameters=[{"name": "OFFSET"}, {"name": "NAME"}])
    resp = _create(world, "dashes", {"OFFSET": "-5", "NAME": "-file-with-a-dash"})
    assert resp.status_code == 201, resp.json()


@pytest.mark.parametrize("value", [
    "/proc/self/environ", "/proc", "//proc/1/environ", "/sys/kernel/notes", "/dev/shm/x", "/run/egress.sock",
    "/home/sandbox/../../proc/self/environ", "../../proc/self/environ", "sub/../../x",
    "file:///proc/self/environ", "config=/proc/self/environ",
])
def test_a_path_parameter_may_not_reach_into_the_kernels_files(world, value: str) -> None:
    """Issue 34 (low): ``ROOT=/proc/self/environ`` (the program's own secrets, the template's
    variables) matched the default pattern."""
    template("with-root", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x", "--root", "${ROOT}"],
             tenant_parameters=[{"name": "ROOT"}])
    resp = _create(world, "with-root", {"ROOT": value})
    assert resp.status_code == 400, resp.json()
    [message] = resp.json()["extra"]["fields"]["parameters"]
    assert message.startswith("ROOT: ") and value in message, message


def test_a_path_parameter_may_not_name_the_platforms_files(world, settings) -> None:
    template("with-root", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x", "--root", "${ROOT}"],
             tenant_parameters=[{"name": "ROOT"}])
    resp = _create(world, "with-root", {"ROOT": f"{settings.BASE_DIR}/var"})
    assert resp.status_code == 400, resp.json()
    assert "ROOT: " in resp.json()["extra"]["fields"]["parameters"][0]


@pytest.mark.parametrize("value", ["/home/sandbox/data", "reports/2026", "notes.txt", "1..2", "/srv/share"])
def test_ordinary_paths_and_values_are_accepted(world, value: str) -> None:
    template("with-root", kind="mcp_stdio", argv=["${PYTHON}", "-m", "x", "--root", "${ROOT}"],
             tenant_parameters=[{"name": "ROOT"}])
    assert _create(world, "with-root", {"ROOT": value}).status_code == 201


def test_a_cli_command_parameter_is_checked_alike(world) -> None:
    from capabilities.services import cli_command_save
    from capabilities.tests.catalogue import cli_template

    lister = cli_template("lister", ["ls", "${DIR}"], tenant_parameters=[{"name": "DIR"}])
    with pytest.raises(ValidationError) as caught:
        cli_command_save(tenant=world.tenant, name="lister", template=lister, parameters={"DIR": "--all"})
    assert "DIR: " in str(caught.value.message_dict["parameters"]), caught.value


def test_a_value_stored_before_the_rule_fails_the_configuration_not_the_program(world) -> None:
    """A row saved before this check (or written around validation) never reaches the program."""
    server = McpServer.all_tenants.create(
        tenant=world.tenant, name="T", alias="t", transport="stdio", template=time_template(),
        parameters={"TIMEZONE": "--help"},
    )
    with tenant_scope(world.tenant.pk), pytest.raises(ValueError, match="TIMEZONE: .*may not start with '-'"):
        mcp_server_config(server=server)
