"""OAuth connections of MCP servers against a fake authorization server: a token in use is not
refreshed, a refused one is refreshed once, a refused refresh asks for a new connection,
disconnect revokes (RFC 7009), the callback's state is one person's and one use, the bearer
auth retries a 401 once and turns a step-up into "connect again"."""

from __future__ import annotations

import asyncio
import hashlib

import httpx2
import pytest
from django.test import Client
from django.utils import timezone
from mcp.client.auth import OAuthTokenError

from capabilities.mcp_oauth.auth import AccessToken, ConnectionAuth, ConnectionRequired
from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.mcp_oauth.runs import connection_id_for_run
from capabilities.mcp_oauth.services import connection_access_token
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server
from tenants.context import outside_scope
from tenants.crypto import secret_decrypt
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def fake(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with FakeAuthorizationServer() as server:
        yield server


def test_a_valid_token_is_used_and_a_refused_one_refreshed_once(world, fake):
    connection = connected(oauth_server(world.tenant), fake, user=world.member, expired=False)
    token = connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk)
    assert token.token == "access-0" and fake.refreshes == []

    for _ in range(2):  # the second caller names the same refused token: another worker already refreshed
        token = connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk, refused="access-0")
        assert token.token == "access-1"
    assert [r["refresh_token"] for r in fake.refreshes] == ["refresh-0"]
    assert fake.refreshes[0]["resource"] == "https://mcp.example.com/mcp"  # RFC 8707
    connection.refresh_from_db()
    assert connection.refresh_count == 1 and "refresh-1" not in connection.refresh_token_encrypted  # encrypted
    assert secret_decrypt(tenant=world.tenant, ciphertext=connection.refresh_token_encrypted) == "refresh-1"
    left = (connection.expires_at - timezone.now()).total_seconds()
    assert 3500 < left <= 3600  # from expires_in, stored
    assert token.expires_at == connection.expires_at.timestamp()


def test_a_refused_refresh_asks_for_a_new_connection(world, fake):
    fake.refuse = True
    server = oauth_server(world.tenant)
    connection = connected(server, fake, user=world.member)
    with pytest.raises(ConnectionRequired, match="connect again"):
        connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk)
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.RECONNECT and "invalid_grant" in connection.last_error
    with pytest.raises(ConnectionRequired):  # no second refresh request for a dead grant
        connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk)
    assert len(fake.refreshes) == 1
    with tenant_scope(world.tenant.pk):  # as a run's database thread has it
        connection_id, why = connection_id_for_run(tenant_id=world.tenant.pk, server_id=server.pk,
                                                   user_id=world.member.pk)
    assert connection_id is None and "has to be made again" in why and "Connect it in Settings" in why
    listed = world.client().get("/api/v1/mcp-connections/").json()
    assert [(row["server_id"], row["status"]) for row in listed] == [(server.pk, "reconnect")]


def test_a_server_error_on_refresh_keeps_the_connection_for_the_next_try(world, fake):
    connection = connected(oauth_server(world.tenant), fake, user=world.member)
    fake.down = True
    with pytest.raises(OAuthTokenError, match="503"):
        connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk)
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.CONNECTED
    fake.down = False
    token = connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk)
    assert token.token == "access-2"  # the second refresh request (the first got the 503)


def test_a_run_of_someone_who_has_not_connected_is_told_where_to_connect(world, fake):
    server = oauth_server(world.tenant)
    connected(server, fake, user=world.admin)
    tenant_server = oauth_server(world.tenant, mode="oauth_tenant")
    tenant_connection = connected(tenant_server, fake)  # the tenant's: every member's runs use it
    with tenant_scope(world.tenant.pk):  # as a run's database thread has it
        assert connection_id_for_run(tenant_id=world.tenant.pk, server_id=server.pk, user_id=world.admin.pk)[0]
        connection_id, why = connection_id_for_run(tenant_id=world.tenant.pk, server_id=server.pk,
                                                   user_id=world.member.pk)
        assert connection_id is None and why.startswith("You have not connected")
        assert connection_id_for_run(tenant_id=world.tenant.pk, server_id=tenant_server.pk,
                                     user_id=world.member.pk) == (tenant_connection.pk, "")


def test_disconnect_revokes_the_tokens_at_the_server(world, fake):
    server = oauth_server(world.tenant)
    connected(server, fake, user=world.member, expired=False)
    client = world.client()
    assert client.delete(f"/api/v1/mcp-connections/{server.pk}/").status_code == 204
    assert [(r["token"], r["token_type_hint"], r["client_id"]) for r in fake.revocations] == [
        ("refresh-0", "refresh_token", "platform-client"), ("access-0", "access_token", "platform-client")]
    assert not McpOAuthConnection.all_tenants.filter(server=server).exists()
    assert client.delete(f"/api/v1/mcp-connections/{server.pk}/").status_code == 404


def test_the_tenants_connection_is_for_admins_to_make_and_remove(world, fake):
    server = oauth_server(world.tenant, mode="oauth_tenant")
    connected(server, fake)
    member = world.client()
    assert member.post(f"/api/v1/mcp-connections/{server.pk}/connect/", {}, format="json").status_code == 403
    assert member.delete(f"/api/v1/mcp-connections/{server.pk}/").status_code == 403
    assert [row["can_connect"] for row in member.get("/api/v1/mcp-connections/").json()] == [False]
    assert world.client(admin=True).delete(f"/api/v1/mcp-connections/{server.pk}/").status_code == 204
    assert len(fake.revocations) == 2


def test_the_callback_state_is_one_persons_and_works_once(world, fake):
    server = oauth_server(world.tenant)
    McpOAuthConnection.all_tenants.create(
        tenant=world.tenant, server=server, user=world.admin, pending_by=world.admin,
        pending_state_hash=hashlib.sha256(b"the-state").hexdigest(), pending_started_at=timezone.now(),
        pending_authorization_server=fake.discovery(server.url))
    browser = Client()
    browser.force_login(world.member)  # not who started it
    with outside_scope():  # as a request arrives: no tenant yet, row-level security shows nothing
        answer = browser.get("/mcp-oauth/callback/", {"state": "the-state", "code": "stolen"})
    assert answer.status_code == 302 and answer["Location"].startswith("/?mcp_connect_error=")
    assert "started+by+someone+else" in answer["Location"] and answer["Location"].endswith("#/settings")
    browser.force_login(world.admin)  # the state was used up by the failed attempt
    with outside_scope():
        answer = browser.get("/mcp-oauth/callback/", {"state": "the-state", "code": "stolen"})
    assert "unknown+or+was+already+used" in answer["Location"]
    assert fake.refreshes == []


def test_the_client_metadata_document_names_itself_and_the_callback():
    document = Client().get("/mcp-oauth/client-metadata.json", secure=True).json()
    assert document["client_id"] == "https://testserver/mcp-oauth/client-metadata.json"
    assert document["redirect_uris"] == ["https://testserver/mcp-oauth/callback/"]
    assert document["token_endpoint_auth_method"] == "none"
    assert document["grant_types"] == ["authorization_code", "refresh_token"]


def _replay(*responses: httpx2.Response):
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("Authorization", ""))
        return responses[len(seen) - 1]

    return httpx2.MockTransport(handler), seen


def test_the_bearer_auth_retries_a_401_once_with_a_fresh_token():
    asked: list[str | None] = []

    async def source(refused):
        asked.append(refused)
        return AccessToken(token=f"t{len(asked)}", expires_at=None)

    transport, seen = _replay(httpx2.Response(401), httpx2.Response(200))

    async def go():
        async with httpx2.AsyncClient(transport=transport, auth=ConnectionAuth(source)) as http:
            return await http.post("https://mcp.example.com/mcp", json={})

    assert asyncio.run(go()).status_code == 200
    assert seen == ["Bearer t1", "Bearer t2"] and asked == [None, "t1"]


def test_a_step_up_challenge_asks_the_person_again_for_more_scopes():
    stepped: list[str | None] = []

    async def source(refused):
        return AccessToken(token="t", expires_at=None)

    async def step_up(scope, why):
        stepped.append(scope)

    challenge = 'Bearer error="insufficient_scope", scope="files:write"'
    transport, _ = _replay(httpx2.Response(403, headers={"WWW-Authenticate": challenge}))

    async def go():
        async with httpx2.AsyncClient(transport=transport, auth=ConnectionAuth(source, step_up=step_up)) as http:
            await http.post("https://mcp.example.com/mcp", json={})

    with pytest.raises(ConnectionRequired) as caught:
        asyncio.run(go())
    assert caught.value.scope == "files:write" and stepped == ["files:write"]
