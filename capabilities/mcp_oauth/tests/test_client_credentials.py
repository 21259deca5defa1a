"""The client-credentials grant (MCP SEP-1046) of a tenant's own client: a server with
``auth_mode`` ``oauth_client_credentials`` is reached without anyone connecting; the run's
first token request discovers the authorization server and asks for a token with the client's
secret (``client_secret_basic`` where the server takes only that) or with a JWT signed by its
private key (``private_key_jwt``, RFC 7523), stored encrypted like the other secrets."""

from __future__ import annotations

import base64
from urllib.parse import parse_qsl

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from capabilities.mcp_oauth import protocol
from capabilities.mcp_oauth.auth import ConnectionRequired
from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.mcp_oauth.runs import connection_id_for_run
from capabilities.mcp_oauth.services import ConnectError, connection_access_token, connection_begin
from capabilities.models import McpAuthMode
from capabilities.services import mcp_server_save
from tenants.crypto import secret_decrypt
from tenants.scoping import tenant_scope

MCP = "https://mcp.example.com/mcp"
AS = "https://auth.example.com"

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _private_key() -> tuple[str, ec.EllipticCurvePublicKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return pem, key.public_key()


class FakeServers:
    """An MCP server that wants a token for everything (401, ``scope="mcp:read"``), its
    resource metadata and an authorization server taking only the client-credentials grant
    with ``auth_methods``. Token requests are recorded (form and ``Authorization``)."""

    def __init__(self, auth_methods: list[str]) -> None:
        self.auth_methods = auth_methods
        self.token_requests: list[tuple[dict[str, str], str]] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        if url == MCP:
            return httpx2.Response(401, headers={"WWW-Authenticate": 'Bearer scope="mcp:read"'})
        if url.endswith("/.well-known/oauth-protected-resource/mcp"):
            return httpx2.Response(200, json={"resource": MCP, "authorization_servers": [AS]})
        if url.startswith(f"{AS}/.well-known/"):
            return httpx2.Response(
                200,
                json={
                    "issuer": AS,
                    "authorization_endpoint": f"{AS}/authorize",
                    "token_endpoint": f"{AS}/token",
                    "response_types_supported": ["code"],
                    "grant_types_supported": ["client_credentials"],
                    "token_endpoint_auth_methods_supported": self.auth_methods,
                },
            )
        if url == f"{AS}/token":
            self.token_requests.append(
                (dict(parse_qsl(request.content.decode())), request.headers.get("Authorization", ""))
            )
            return httpx2.Response(
                200, json={"access_token": f"cc-{len(self.token_requests)}", "token_type": "Bearer", "expires_in": 3600}
            )
        return httpx2.Response(404)


@pytest.fixture
def servers(monkeypatch):
    """Every OAuth request of the services goes to :class:`FakeServers` (basic auth only)."""
    fake = FakeServers(["client_secret_basic"])
    monkeypatch.setattr(
        "capabilities.mcp_oauth.services.oauth_http",
        lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handler)),
    )
    return fake


def _server(world, **secrets):
    with tenant_scope(world.tenant.pk):
        return mcp_server_save(
            tenant=world.tenant,
            name="Machine",
            alias="machine",
            transport="streamable_http",
            url=MCP,
            auth_mode=McpAuthMode.OAUTH_CLIENT_CREDENTIALS,
            oauth_client_id="platform-cc",
            **secrets,
        )


def _run_token(world, server):
    with tenant_scope(world.tenant.pk):  # as a run's database thread has it
        connection_id, why = connection_id_for_run(tenant_id=world.tenant.pk, server_id=server.pk, user_id=None)
    assert why == "" and connection_id is not None
    return connection_id, connection_access_token(tenant_id=world.tenant.pk, connection_id=connection_id)


def test_a_run_gets_the_tenants_token_with_the_client_secret_and_nobody_connects(world, servers):
    server = _server(world, oauth_client_secret="s3cret")
    assert "s3cret" not in server.oauth_client_secret_encrypted
    connection_id, token = _run_token(world, server)

    assert token.token == "cc-1"
    [(form, authorization)] = servers.token_requests
    assert form == {
        "grant_type": "client_credentials",
        "resource": MCP,
        "scope": "mcp:read",
        "client_id": "platform-cc",
    }  # the 401's scope, RFC 8707 resource, no secret in the form
    assert base64.b64decode(authorization.removeprefix("Basic ")) == b"platform-cc:s3cret"
    connection = McpOAuthConnection.all_tenants.get(pk=connection_id)
    assert connection.user_id is None and connection.status == ConnectionStatus.CONNECTED
    assert connection.scope == "mcp:read"
    assert secret_decrypt(tenant=world.tenant, ciphertext=connection.access_token_encrypted) == "cc-1"
    assert _run_token(world, server) == (connection_id, token)  # the stored token, no second request
    assert len(servers.token_requests) == 1
    assert (
        connection_access_token(tenant_id=world.tenant.pk, connection_id=connection_id, refused="cc-1").token == "cc-2"
    )  # refused by the server: a new one (there is no refresh token)
    with tenant_scope(world.tenant.pk), pytest.raises(ConnectError, match="client credentials"):
        connection_begin(server=server, user=world.admin, is_admin=True, base_url="https://platform.example")


def test_a_private_key_signs_the_clients_assertion(world, servers):
    servers.auth_methods = ["private_key_jwt"]
    pem, public_key = _private_key()
    server = _server(world, oauth_private_key=pem)
    assert "PRIVATE KEY" not in server.oauth_private_key_encrypted

    _, token = _run_token(world, server)

    assert token.token == "cc-1"
    [(form, authorization)] = servers.token_requests
    assert authorization == "" and "client_secret" not in form
    assert form["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    claims = jwt.decode(form["client_assertion"], public_key, algorithms=["ES256"], audience=[AS, f"{AS}/"])
    assert claims["iss"] == claims["sub"] == "platform-cc" and claims["exp"] - claims["iat"] == 300
    assert claims["jti"]


def test_refused_credentials_say_what_an_admin_has_to_check(world, servers, monkeypatch):
    server = _server(world, oauth_client_secret="wrong")
    servers.handler_before = servers.handler

    def refusing(request):
        if str(request.url) == f"{AS}/token":
            return httpx2.Response(401, json={"error": "invalid_client"})
        return servers.handler_before(request)

    monkeypatch.setattr(
        "capabilities.mcp_oauth.services.oauth_http",
        lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(refusing)),
    )
    with pytest.raises(ConnectionRequired, match="client credentials.*invalid_client"):
        _run_token(world, server)
    with tenant_scope(world.tenant.pk):  # the next run tries again (an admin may have fixed them)
        assert connection_id_for_run(tenant_id=world.tenant.pk, server_id=server.pk, user_id=None)[0]


def test_the_signing_algorithm_follows_the_key():
    pem, _ = _private_key()
    assert protocol.signing_algorithm(pem) == "ES256"
    with pytest.raises(protocol.OAuthFlowError, match="not an unencrypted PEM"):
        protocol.signing_algorithm("not a key")


def test_an_admin_enters_the_private_key_write_only(world):
    pem, _ = _private_key()
    server = _server(world, oauth_client_secret="")
    admin = world.client(admin=True)
    answer = admin.patch(f"/api/v1/admin/mcp-servers/{server.pk}/", {"oauth_private_key": pem}, format="json")
    assert answer.status_code == 200, answer.content
    assert "oauth_private_key" not in answer.json() and "PRIVATE KEY" not in answer.content.decode()
    assert answer.json()["auth_mode"] == "oauth_client_credentials"
    server.refresh_from_db()
    assert secret_decrypt(tenant=world.tenant, ciphertext=server.oauth_private_key_encrypted) == pem
    assert world.client().get("/api/v1/mcp-connections/").json() == []  # nobody connects it
    answer = admin.post(f"/api/v1/mcp-connections/{server.pk}/connect/", {}, format="json")
    assert answer.status_code == 400 and "client credentials" in answer.json()["message"]
