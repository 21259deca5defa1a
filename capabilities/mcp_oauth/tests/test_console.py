"""The console's Connect / Disconnect on an OAuth MCP server's change page (Django test client as
a tenant admin; the requests run unscoped, as a real request arrives)."""

from __future__ import annotations

import pytest
from django.test import Client

from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server
from tenants.context import outside_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def fake(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with FakeAuthorizationServer() as server:
        yield server


def _admin(world) -> Client:
    client = Client()
    client.force_login(world.admin)
    return client


def test_the_change_page_connects_and_disconnects_the_tenants_account(world, fake):
    server = oauth_server(world.tenant, mode="oauth_tenant", url=f"{fake.url}/mcp")
    connected(server, fake, expired=False)
    client, base = _admin(world), f"/admin/capabilities/mcpserver/{server.pk}"
    with outside_scope():
        page = client.get(f"{base}/change/").content.decode()
        assert f"{base}/oauth-connect/" in page and "The tenant&#x27;s account: connected (scopes: read" in page
        # the fake serves no metadata: discovery fails with a message on the page, no 500
        failed = client.post(f"{base}/oauth-connect/", follow=True)
        assert failed.status_code == 200 and "No authorization server metadata found" in failed.content.decode()
        gone = client.post(f"{base}/oauth-disconnect/")
    assert gone.status_code == 302
    assert [r["token_type_hint"] for r in fake.revocations] == ["refresh_token", "access_token"]
    assert not McpOAuthConnection.all_tenants.filter(server=server).exists()


def test_another_tenants_server_cannot_be_connected_or_disconnected(world, other_world, fake):
    theirs = oauth_server(other_world.tenant, mode="oauth_tenant")
    connected(theirs, fake)
    client, base = _admin(world), f"/admin/capabilities/mcpserver/{theirs.pk}"
    with outside_scope():
        assert client.post(f"{base}/oauth-connect/").status_code == 404
        assert client.post(f"{base}/oauth-disconnect/").status_code == 404
    assert fake.revocations == [] and McpOAuthConnection.all_tenants.filter(server=theirs).exists()
