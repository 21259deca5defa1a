"""The console's Connect / Disconnect on an OAuth MCP server's change page, and a
client-credentials server's token status there (Django test client as a tenant admin; the
requests run unscoped, as a real request arrives)."""

from __future__ import annotations

import datetime as dt

import httpx2
import pytest
from django.test import Client

from capabilities.mcp_oauth.auth import ConnectionRequired
from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.mcp_oauth.services import connection_access_token
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server
from tenants.context import outside_scope
from tenants.scoping import tenant_scope

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


# ------------------------------------------------------- client credentials: the token's status --


@pytest.fixture
def cc_servers(monkeypatch):
    """The authorization server of test_client_credentials (a client-credentials grant only)."""
    from capabilities.mcp_oauth.tests.test_client_credentials import FakeServers

    fake = FakeServers(["client_secret_basic"])
    monkeypatch.setattr("capabilities.mcp_oauth.services.oauth_http",
                        lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handler)))
    return fake


def _refusing_token_endpoint(fake):
    """From now on the token endpoint answers ``invalid_client`` (the secret was changed there)."""
    handler = fake.handler

    def refuse(request: httpx2.Request) -> httpx2.Response:
        if str(request.url).endswith("/token"):
            return httpx2.Response(401, json={"error": "invalid_client", "error_description": "bad secret"})
        return handler(request)
    fake.handler = refuse


def test_the_change_page_shows_the_client_credentials_tokens_status(world, cc_servers):
    from capabilities.mcp_oauth.tests.test_client_credentials import _run_token, _server

    server = _server(world, oauth_client_secret="s3cret")
    client, base = _admin(world), f"/admin/capabilities/mcpserver/{server.pk}"
    with outside_scope():
        page = client.get(f"{base}/change/").content.decode()
    assert 'data-testid="mcp-oauth-state">none yet: the first run that uses the server gets one.' in page
    assert f"{base}/oauth-connect/" not in page  # nobody connects such a server

    connection_id, _ = _run_token(world, server)  # a run gets the tenant's token
    connection = McpOAuthConnection.all_tenants.get(pk=connection_id)
    with outside_scope():
        page = client.get(f"{base}/change/").content.decode()
    assert 'data-testid="mcp-oauth-state">obtained (scopes: mcp:read)' in page
    assert f'data-testid="mcp-oauth-expires">{connection.expires_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC<' in page
    assert f'data-testid="mcp-oauth-obtained">{connection.updated_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC<' in page
    assert 'data-testid="mcp-oauth-last-error">none<' in page
    assert "cc-1" not in page and "s3cret" not in page  # no token, no secret

    _refusing_token_endpoint(cc_servers)
    with tenant_scope(world.tenant.pk), pytest.raises(ConnectionRequired):
        connection_access_token(tenant_id=world.tenant.pk, connection_id=connection_id, refused="cc-1")
    with outside_scope():
        page = client.get(f"{base}/change/").content.decode()
    assert 'data-testid="mcp-oauth-state">the last request failed: the next run that uses the server tries again.' in page
    assert "getting a token failed" in page and "bad secret" in page  # the authorization server's own words
    assert f'data-testid="mcp-oauth-first-obtained">{connection.connected_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC<' in page


def test_another_tenants_admin_does_not_see_the_client_credentials_status(world, other_world, cc_servers):
    from capabilities.mcp_oauth.tests.test_client_credentials import _run_token, _server

    server = _server(world, oauth_client_secret="s3cret")
    _run_token(world, server)
    client, base = _admin(other_world), f"/admin/capabilities/mcpserver/{server.pk}"
    with outside_scope():
        page = client.get(f"{base}/change/", follow=True)
        listing = client.get("/admin/capabilities/mcpserver/").content.decode()
    assert page.redirect_chain and page.redirect_chain[-1][0] == "/admin/"  # "doesn't exist", as a missing one
    assert "mcp-oauth-status" not in page.content.decode() and "mcp:read" not in page.content.decode()
    assert "Machine" not in listing
