"""End to end against the platform's own OAuth-protected MCP server (/mcp/knowledge/, app
oauth_server) on a real socket: Connect (discovery from the 401, dynamic registration, PKCE,
``resource``), the person signs in and consents, the callback checks ``iss`` and stores the
tokens; a run's MCP connection lists and calls tools with them; an expired token is refreshed
(rotated) on the next connection; Disconnect revokes the grant at the server."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connection as db_connection
from django.test import Client
from django.utils import timezone

from capabilities.mcp.client import McpConnection
from capabilities.mcp.kind import McpBindingSpec
from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.mcp_oauth.runs import with_connections
from capabilities.models import McpServer
from capabilities.registry import OpenContext
from capabilities.services import mcp_server_config
from oauth_server.tests import test_mcp_sdk_oauth as sdk_flow
from tenants.crypto import secret_decrypt
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("all_tenants_scope"),
]


def _config(server: McpServer):
    try:
        return mcp_server_config(server=server)
    finally:
        db_connection.close()


async def _tools_of(server: McpServer, user_id: int) -> tuple[list[str], object]:
    """What a run of ``user_id`` does: the binding's config gets the user's connection
    (capabilities.mcp_oauth.runs), then the MCP session lists and calls tools."""
    spec = McpBindingSpec(server=await sync_to_async(_config)(server), allowed_tools=frozenset(),
                          server_id=server.pk, auth_mode=server.auth_mode)

    def in_thread(fn):  # what the runner's database thread does: the run's tenant scope
        def scoped(**kwargs):
            try:
                with tenant_scope(server.tenant_id):
                    return fn(**kwargs)
            finally:
                db_connection.close()
        return sync_to_async(scoped, thread_sensitive=False)

    async with contextlib.AsyncExitStack() as stack:
        ctx = OpenContext(tenant_id=server.tenant_id, run_id=0, tool_timeout_seconds=30, stack=stack,
                          in_thread=in_thread, user_id=user_id)
        [spec] = await with_connections([spec], ctx)
        assert spec.server.auth_key.startswith("oauth:")
        async with McpConnection(spec.server) as connection:
            tools = await connection.list_tools()
            result = await connection.call_tool("knowledge_bases", {}, timeout_seconds=30)
    return [tool.name for tool in tools], result


def _connect(world, server: McpServer, live_server_url: str, api: httpx.Client, monkeypatch) -> None:
    """Connect as the member: the API's authorization URL, the person's sign-in and consent,
    the callback (as the member's browser)."""
    mcp_url, callback = server.url, f"{live_server_url}/mcp-oauth/callback/"
    started = api.post(f"/api/v1/mcp-connections/{server.pk}/connect/", json={"return_to": "/#/settings"})
    assert started.status_code == 200, started.text
    params = {k: v[0] for k, v in parse_qs(urlsplit(started.json()["authorization_url"]).query).items()}
    assert (params["resource"], params["redirect_uri"], params["code_challenge_method"]) == (mcp_url, callback, "S256")
    assert len(params["state"]) >= 43
    assert params["client_id"]  # registered dynamically (no https here, so no metadata document)

    monkeypatch.setattr(sdk_flow, "REDIRECT_URI", callback)  # where the person's browser stops
    person = sdk_flow.Person("acme-user", "pw-user-123")
    person.visit(started.json()["authorization_url"])
    assert person.callback["iss"] == live_server_url  # RFC 9207, checked by the callback

    browser = Client()
    browser.force_login(world.member)
    back = browser.get("/mcp-oauth/callback/", person.callback)
    assert (back.status_code, back["Location"]) == (302, f"/?mcp_connected={server.pk}#/settings")


def _status_with(url: str, token: str) -> int:
    probe = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25",
               "Authorization": f"Bearer {token}"}
    return httpx.post(url, json=probe, headers=headers).status_code


def test_connect_use_refresh_and_disconnect_with_our_own_oauth_server(world, live_server_url, settings, monkeypatch):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    mcp_url = f"{live_server_url}/mcp/knowledge/"
    server = McpServer.all_tenants.create(tenant=world.tenant, name="Our knowledge", alias="ourkb",
                                          transport="streamable_http", url=mcp_url, auth_mode="oauth_user")
    api = httpx.Client(base_url=live_server_url, headers={"Authorization": f"Bearer {world.member_token}"},
                       timeout=60)
    _connect(world, server, live_server_url, api, monkeypatch)
    connection = McpOAuthConnection.all_tenants.get(server=server, user=world.member)
    assert connection.status == "connected"
    assert connection.expires_at > timezone.now()
    assert [row["status"] for row in api.get("/api/v1/mcp-connections/").json()] == ["connected"]

    names, result = asyncio.run(_tools_of(server, world.member.pk))
    assert names == ["knowledge_bases", "knowledge_search"]
    assert result.data == {"knowledge_bases": []}

    # the token has expired: the next connection refreshes it once (the server rotates it)
    McpOAuthConnection.all_tenants.filter(pk=connection.pk).update(expires_at=timezone.now())
    names, _ = asyncio.run(_tools_of(server, world.member.pk))
    assert names == ["knowledge_bases", "knowledge_search"]
    connection.refresh_from_db()
    assert connection.refresh_count == 1
    token = secret_decrypt(tenant=world.tenant, ciphertext=connection.access_token_encrypted)
    assert _status_with(mcp_url, token) == 200

    assert api.delete(f"/api/v1/mcp-connections/{server.pk}/").status_code == 204
    assert _status_with(mcp_url, token) == 401  # revoked at the server (RFC 7009)
    assert not McpOAuthConnection.all_tenants.filter(server=server).exists()
