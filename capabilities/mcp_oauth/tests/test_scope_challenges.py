"""Scope challenges on any request (MCP authorization spec, "Scope Selection Strategy"; issue 37):
Connect's probe finds the 401 of a server that lets ``initialize`` through and guards only its
operations, and asks for that 401's scope rather than ``scopes_supported``; a run's request
refused with a 401 even after a fresh token marks the connection "connect again" with the
challenged scope; a re-authorization asks for the union of what was asked for, what was
granted and the new scope (SEP-2350)."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest

from capabilities.mcp_oauth import protocol
from capabilities.mcp_oauth.auth import AccessToken, ConnectionAuth, ConnectionRequired
from capabilities.mcp_oauth.models import ConnectionStatus
from capabilities.mcp_oauth.runs import connection_id_for_run
from capabilities.mcp_oauth.services import connection_step_up
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server
from tenants.scoping import tenant_scope

MCP = "https://mcp.example.com/mcp"
PRM = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
AS = "https://auth.example.com"


def _guarded_only_on_operations(seen: list[tuple[str, str, str]]) -> httpx2.MockTransport:
    """An MCP server (and its metadata) that lets ``initialize`` and notifications through
    unauthenticated, giving a session, and answers anything else without a token with a 401
    ``scope="mcp:basic"``; its resource metadata lists only ``mcp:profile``."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        if url == PRM:
            return httpx2.Response(
                200, json={"resource": MCP, "authorization_servers": [AS], "scopes_supported": ["mcp:profile"]}
            )
        if url.startswith(f"{AS}/.well-known/"):
            return httpx2.Response(
                200,
                json={
                    "issuer": AS,
                    "authorization_endpoint": f"{AS}/authorize",
                    "token_endpoint": f"{AS}/token",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        if url != MCP:
            return httpx2.Response(404)
        method = json.loads(request.content)["method"] if request.method == "POST" else request.method
        seen.append((request.method, method, request.headers.get("mcp-session-id", "")))
        if method == "initialize":
            return httpx2.Response(
                200,
                headers={"Mcp-Session-Id": "s-1"},
                json={
                    "jsonrpc": "2.0",
                    "id": 0,
                    "result": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "serverInfo": {"name": "guarded", "version": "1"},
                    },
                },
            )
        if method.startswith("notifications/"):
            return httpx2.Response(202)
        if method == "DELETE":
            return httpx2.Response(200)
        return httpx2.Response(
            401,
            headers={"WWW-Authenticate": f'Bearer scope="mcp:basic", resource_metadata="{PRM}"'},
            json={"error": "invalid_token"},
        )

    return httpx2.MockTransport(handler)


def test_connect_asks_for_the_scope_of_a_401_that_comes_after_initialize():
    seen: list[tuple[str, str, str]] = []

    async def go() -> protocol.Discovery:
        async with httpx2.AsyncClient(transport=_guarded_only_on_operations(seen)) as http:
            return await protocol.discover(http, MCP)

    found = asyncio.run(go())
    assert found.scope == "mcp:basic"  # the challenge's scope wins over scopes_supported (mcp:profile)
    assert str(found.metadata.issuer).rstrip("/") == AS and found.resource == MCP
    assert seen == [
        ("POST", "initialize", ""),
        ("POST", "notifications/initialized", "s-1"),
        ("POST", "tools/list", "s-1"),
        ("DELETE", "DELETE", "s-1"),
    ]  # the probe's session ended


def test_an_admin_set_scope_still_overrides_the_challenge():
    async def go() -> protocol.Discovery:
        async with httpx2.AsyncClient(transport=_guarded_only_on_operations([])) as http:
            return await protocol.discover(http, MCP, scope="mcp:admin")

    assert asyncio.run(go()).scope == "mcp:admin"


def _replay(*responses: httpx2.Response):
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("Authorization", ""))
        return responses[len(seen) - 1]

    return httpx2.MockTransport(handler), seen


def test_a_401_on_a_later_request_even_after_a_fresh_token_asks_to_connect_again_with_its_scope():
    asked: list[str | None] = []
    stepped: list[tuple[str | None, str]] = []

    async def source(refused):
        asked.append(refused)
        return AccessToken(token=f"t{len(asked)}", expires_at=None)

    async def step_up(scope, why):
        stepped.append((scope, why))

    challenge = {"WWW-Authenticate": 'Bearer error="invalid_token", scope="files:read"'}
    transport, seen = _replay(
        httpx2.Response(200), httpx2.Response(401, headers=challenge), httpx2.Response(401, headers=challenge)
    )

    async def go():
        auth = ConnectionAuth(source, server_id=7, step_up=step_up)
        async with httpx2.AsyncClient(transport=transport, auth=auth) as http:
            assert (await http.post(MCP, json={"method": "initialize"})).status_code == 200
            await http.post(MCP, json={"method": "tools/list"})  # the later request: challenged

    with pytest.raises(ConnectionRequired) as caught:
        asyncio.run(go())
    assert caught.value.scope == "files:read" and caught.value.server_id == 7
    assert "connect again" in caught.value.message
    assert seen == ["Bearer t1", "Bearer t1", "Bearer t2"] and asked == [None, "t1"]  # refreshed once first
    assert [scope for scope, _ in stepped] == ["files:read"] and "refused the connection's token" in stepped[0][1]


@pytest.mark.django_db
@pytest.mark.usefixtures("all_tenants_scope")
def test_reauthorization_asks_for_what_was_asked_granted_and_challenged(world, settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with FakeAuthorizationServer() as fake:
        server = oauth_server(world.tenant)
        connection = connected(server, fake, user=world.member, expired=False)
    # The first Connect asked for the 401's mcp:basic and mcp:profile; the server granted mcp:basic only.
    connection.authorization_server = {**connection.authorization_server, "scope": "mcp:basic mcp:profile"}
    connection.scope = "mcp:basic"
    connection.save()

    connection_step_up(
        tenant_id=world.tenant.pk,
        connection_id=connection.pk,
        scope="mcp:write",
        why="The MCP server asks for more access (mcp:write)",
    )

    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.RECONNECT
    assert connection.requested_scope == "mcp:basic mcp:profile mcp:write"
    assert connection.last_error == "The MCP server asks for more access (mcp:write)"
    with tenant_scope(world.tenant.pk):  # the next run: the "connect again" path, not the server
        connection_id, why = connection_id_for_run(
            tenant_id=world.tenant.pk, server_id=server.pk, user_id=world.member.pk
        )
    assert connection_id is None and "has to be made again" in why and "mcp:write" in why
