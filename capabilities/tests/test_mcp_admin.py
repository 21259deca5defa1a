"""The console's "Test connection" for MCP servers (Django test client as a tenant admin).

The test runs on a worker (the ``celery_worker`` fixture: a real Celery worker thread on the
real Redis broker), never in the web process."""

from __future__ import annotations

import pytest
from django.test import Client

from capabilities.models import McpServer
from capabilities.tests.catalogue import time_template
from capabilities.tests.mcp_test_server import serve_mcp_http

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(90), pytest.mark.usefixtures("all_tenants_scope")]


def admin_client(world) -> Client:
    client = Client()
    client.force_login(world.admin)
    return client


def time_server(world) -> McpServer:
    return McpServer.all_tenants.create(
        tenant=world.tenant, name="Time", alias="time", transport="stdio", template=time_template(),
        parameters={"TIMEZONE": "UTC"}, connect_timeout_seconds=30,
    )


def test_change_page_links_to_test_connection_and_shows_the_snapshot(world):
    server = time_server(world)
    server.tools_snapshot = [{"name": "get_current_time", "description": "Now <b>here</b>", "input_schema": {}}]
    server.save()
    page = admin_client(world).get(f"/admin/capabilities/mcpserver/{server.pk}/change/").content.decode()
    assert f"/admin/capabilities/mcpserver/{server.pk}/test-connection/" in page
    assert "<code>get_current_time</code>" in page
    assert "Now &lt;b&gt;here&lt;/b&gt;" in page, "server text is escaped"


def test_test_connection_lists_the_tools_and_stores_the_snapshot(world, celery_worker):
    server = time_server(world)
    client = admin_client(world)
    assert "Test connection" in client.get(f"/admin/capabilities/mcpserver/{server.pk}/test-connection/").content.decode()
    page = client.post(f"/admin/capabilities/mcpserver/{server.pk}/test-connection/").content.decode()
    assert "Connected" in page and "2 tools listed" in page
    assert "<code>get_current_time</code>" in page and "<code>convert_time</code>" in page
    server.refresh_from_db()
    assert sorted(t["name"] for t in server.tools_snapshot) == ["convert_time", "get_current_time"]
    assert server.tools_snapshot_at is not None and server.last_error == ""


def test_an_offline_server_shows_the_error_and_keeps_the_last_snapshot(world, celery_worker, settings):
    settings.OUTBOUND_ALLOWED_CIDRS = list(getattr(settings, "OUTBOUND_ALLOWED_CIDRS", [])) + ["127.0.0.1/32"]
    client = admin_client(world)
    with serve_mcp_http() as running:
        server = McpServer.all_tenants.create(
            tenant=world.tenant, name="Web", alias="web", transport="streamable_http", url=running.url,
            connect_timeout_seconds=5,
        )
        assert "Connected" in client.post(f"/admin/capabilities/mcpserver/{server.pk}/test-connection/").content.decode()
    page = client.post(f"/admin/capabilities/mcpserver/{server.pk}/test-connection/").content.decode()
    assert "Connection failed" in page and "Could not connect to MCP server &#x27;web&#x27;" in page
    assert "<code>echo</code>" in page, "the last snapshot is still shown"
    server.refresh_from_db()
    assert "Could not connect" in server.last_error and any(t["name"] == "echo" for t in server.tools_snapshot)


def test_another_tenants_server_is_not_found(world, other_world):
    theirs = time_server(other_world)
    client = admin_client(world)
    assert client.get(f"/admin/capabilities/mcpserver/{theirs.pk}/test-connection/").status_code == 404
    assert client.post(f"/admin/capabilities/mcpserver/{theirs.pk}/test-connection/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.tools_snapshot_at is None, "nothing was run for the other tenant"


def test_a_member_cannot_use_it(world):
    server = time_server(world)
    client = Client()
    client.force_login(world.member)
    resp = client.post(f"/admin/capabilities/mcpserver/{server.pk}/test-connection/")
    assert resp.status_code == 302 and "/login/" in resp["Location"]


def test_an_mcp_alias_may_not_be_a_platform_tool_source(world):
    from django.core.exceptions import ValidationError

    server = McpServer(tenant=world.tenant, name="x", alias="builtin", transport="stdio", template=time_template())
    with pytest.raises(ValidationError) as info:
        server.full_clean()
    assert "alias" in info.value.message_dict


def test_the_web_process_never_starts_the_program(world, settings, monkeypatch):
    """Attack C1: the console's Test connection ran the tenant's program inside the web process.
    Now it only asks a worker: with no worker, nothing runs here and the page says why."""
    import capabilities.services as services

    def refuse(**kwargs):
        raise AssertionError("the web process tried to connect to the server itself")

    monkeypatch.setattr(services, "mcp_server_test_connection", refuse)
    settings.MCP_TEST_CONNECTION_WAIT_SECONDS = 1
    server = time_server(world)
    page = admin_client(world).post(f"/admin/capabilities/mcpserver/{server.pk}/test-connection/").content.decode()
    assert "Connection failed" in page and "No worker answered within 1 s" in page
    server.refresh_from_db()
    assert server.tools_snapshot_at is None
