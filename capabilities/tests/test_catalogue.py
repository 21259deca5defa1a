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

pytestmark = pytest.mark.django_db

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
    assert dict(config.sandbox.env) == {"API_TOKEN": "t"} and dict(config.env) == {}


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
