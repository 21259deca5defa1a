"""End to end with the ``mcp`` SDK's own OAuth client (``mcp.client.auth.OAuthClientProvider``)
against the platform on a real socket: the 401's ``WWW-Authenticate`` pointer, protected-resource
and authorization-server discovery, dynamic registration, the authorization redirect (a person
signs in on the chat app and consents: :class:`Person`, through the real pages and API), PKCE S256, the code's exchange
with the resource, then MCP calls with the token; a refresh rotates the refresh token. A token
for /mcp/knowledge/ is refused at /mcp/agents/ and the other way round; another tenant's token
sees only its own tenant."""

from __future__ import annotations

import asyncio
import re
import time
from html import unescape
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from oauth_server.models import McpGrant
from oauth_server.tests.flow import REDIRECT_URI, hidden_fields

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("all_tenants_scope"),
]


class MemoryStorage(TokenStorage):
    """The SDK's storage protocol, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class Person:
    """The user at the browser: follows the authorization URL, signs in on the chat app,
    chooses a tenant on the consent page and allows; the client's redirect target is where the
    final redirect points (never fetched: its query is the callback)."""

    def __init__(self, username: str, password: str, tenant_name: str | None = None) -> None:
        self.username, self.password, self.tenant_name = username, password, tenant_name
        self.pages: list[str] = []
        self.callback: dict[str, str] = {}

    def _form_post(self, browser: httpx.Client, url: str, page: str, data: dict[str, str]) -> httpx.Response:
        return browser.post(url, data={**hidden_fields(page), **data}, headers={"Referer": url})

    def _sign_in(self, browser: httpx.Client, url: str) -> httpx.Response:
        """What the chat app does on its sign-in form (app.js): POST /api/v1/auth/login/ with the
        CSRF cookie, then go to the ``next`` of its URL (a 302 here, to keep the loop simple)."""
        origin = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"
        answer = browser.post(
            f"{origin}/api/v1/auth/login/",
            json={"username": self.username, "password": self.password},
            headers={"X-CSRFToken": browser.cookies["csrftoken"], "Origin": origin, "Referer": url},
        )
        assert answer.status_code == 200, answer.text
        back = parse_qs(urlsplit(url).query)["next"][0]
        return httpx.Response(302, headers={"location": back}, request=httpx.Request("GET", url))

    def _consent(self, browser: httpx.Client, url: str, page: str) -> httpx.Response:
        choices = dict(re.findall(r'name="membership" value="(\d+)"[^>]*> ([^<]+?) <span', page))
        membership = next(pk for pk, name in choices.items() if self.tenant_name in (None, unescape(name)))
        return self._form_post(browser, url, page, {"membership": membership, "allow": "on"})

    def visit(self, authorization_url: str) -> None:
        with httpx.Client(follow_redirects=False, timeout=30) as browser:
            response = browser.get(authorization_url)
            while response.status_code == 302 and not response.headers["location"].startswith(REDIRECT_URI):
                url = urljoin(str(response.url), response.headers["location"])
                page = browser.get(url)
                self.pages.append(urlsplit(url).path)
                text = page.text
                if urlsplit(url).path == "/":  # the chat app's sign-in; its script does this, then goes to next
                    response = self._sign_in(browser, url)
                elif page.status_code == 200:
                    response = self._consent(browser, url, text)
                else:
                    response = page
            assert response.status_code == 302, response.text[:500]
            self.callback = {k: v[0] for k, v in parse_qs(urlsplit(response.headers["location"]).query).items()}

    async def redirect_handler(self, authorization_url: str) -> None:
        await asyncio.to_thread(self.visit, authorization_url)

    async def callback_handler(self) -> AuthorizationCodeResult:
        return AuthorizationCodeResult(
            code=self.callback["code"], state=self.callback.get("state"), iss=self.callback.get("iss")
        )


def _provider(server_url: str, person: Person, storage: MemoryStorage) -> OAuthClientProvider:
    metadata = OAuthClientMetadata(
        redirect_uris=[REDIRECT_URI],
        client_name="SDK test client",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    return OAuthClientProvider(
        server_url=server_url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=person.redirect_handler,
        callback_handler=person.callback_handler,
    )


async def _session(server_url: str, provider: OAuthClientProvider, calls):
    async with httpx2.AsyncClient(auth=provider, timeout=60) as http:
        async with Client(streamable_http_client(server_url, http_client=http)) as client:
            return await calls(client)


async def _list_and_call(client):
    tools = await client.list_tools()
    result = await client.call_tool("knowledge_bases", {})
    return [tool.name for tool in tools.tools], result


def test_the_sdk_client_connects_with_oauth_and_refreshes(world, live_server_url):
    server_url = f"{live_server_url}/mcp/knowledge/"
    person, storage = Person("acme-user", "pw-user-123"), MemoryStorage()
    provider = _provider(server_url, person, storage)

    names, result = asyncio.run(_session(server_url, provider, _list_and_call))

    assert names == ["knowledge_bases", "knowledge_search"]
    assert not result.is_error and result.structured_content == {"knowledge_bases": []}
    assert person.pages == ["/", "/oauth/authorize/"]  # the chat app's sign-in, then the consent page
    assert person.callback["iss"] == live_server_url
    assert storage.client_info.client_id and storage.tokens.refresh_token
    grant = McpGrant.all_tenants.get()
    assert grant.membership == world.member_membership and grant.resource == server_url
    assert grant.application.name == "SDK test client"

    # the access token has expired (for the client): it refreshes, with the resource; rotated
    first = storage.tokens
    provider.context.token_expiry_time = time.time() - 1
    names, _ = asyncio.run(_session(server_url, provider, _list_and_call))
    assert names == ["knowledge_bases", "knowledge_search"]
    assert storage.tokens.refresh_token != first.refresh_token and storage.tokens.access_token != first.access_token
    assert len(person.pages) == 2  # no second visit: the refresh did it
    reused = httpx.post(
        f"{live_server_url}/oauth/token/",
        data={
            "grant_type": "refresh_token",
            "refresh_token": first.refresh_token,
            "client_id": storage.client_info.client_id,
            "resource": server_url,
        },
    )
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"


def _probe(url: str, token: str) -> httpx.Response:
    return httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
    )


def _token_for(live_server_url: str, mount: str, username: str, password: str) -> str:
    storage = MemoryStorage()
    server_url = f"{live_server_url}{mount}"
    asyncio.run(_session(server_url, _provider(server_url, Person(username, password), storage), _list_tools))
    return storage.tokens.access_token


async def _list_tools(client):
    return await client.list_tools()


def test_a_token_is_refused_at_the_other_endpoint(world, live_server_url):
    knowledge = _token_for(live_server_url, "/mcp/knowledge/", "acme-user", "pw-user-123")
    agents = _token_for(live_server_url, "/mcp/agents/", "acme-user", "pw-user-123")
    assert _probe(f"{live_server_url}/mcp/knowledge/", knowledge).status_code == 200
    assert _probe(f"{live_server_url}/mcp/agents/", agents).status_code == 200
    for url, token in ((f"{live_server_url}/mcp/agents/", knowledge), (f"{live_server_url}/mcp/knowledge/", agents)):
        refused = _probe(url, token)
        assert refused.status_code == 401
        mount = urlsplit(url).path
        assert refused.headers["www-authenticate"] == (
            f'Bearer resource_metadata="{live_server_url}/.well-known/oauth-protected-resource{mount}"'
        )
    # and not at the REST API either
    assert (
        httpx.get(f"{live_server_url}/api/v1/sessions/", headers={"Authorization": f"Bearer {knowledge}"}).status_code
        == 401
    )


def test_the_401_points_at_the_resource_metadata(live_server_url):
    for mount in ("/mcp/agents/", "/mcp/knowledge/"):
        answer = httpx.post(f"{live_server_url}{mount}", json={})
        assert answer.status_code == 401
        pointer = re.search(r'resource_metadata="([^"]+)"', answer.headers["www-authenticate"]).group(1)
        assert pointer == f"{live_server_url}/.well-known/oauth-protected-resource{mount}"
        assert httpx.get(pointer).json()["resource"] == f"{live_server_url}{mount}"


def test_another_tenants_token_sees_only_its_own_tenant(world, other_world, live_server_url):
    from knowledge.tests import builders as kb_builders

    kb_builders.knowledge_base(world.tenant, "Acme handbook")
    kb_builders.knowledge_base(other_world.tenant, "Globex handbook")
    server_url = f"{live_server_url}/mcp/knowledge/"
    for (username, password), expected in (
        (("globex-user", "pw-user-123"), ["Globex handbook"]),
        (("acme-user", "pw-user-123"), ["Acme handbook"]),
    ):
        person = Person(username, password)
        _, result = asyncio.run(_session(server_url, _provider(server_url, person, MemoryStorage()), _list_and_call))
        assert [kb["name"] for kb in result.structured_content["knowledge_bases"]] == expected


def test_the_sdk_client_identifies_itself_with_a_metadata_document(world, live_server_url, monkeypatch):
    """CIMD end to end: the SDK client, given ``client_metadata_url`` and seeing
    ``client_id_metadata_document_supported``, registers nothing and uses the URL as its
    client_id; the server fetches the document (the fetch is faked here: an https host the
    address check would let through is not available to a test) and the flow completes."""
    import json

    from oauth2_provider.models import Application

    from capabilities.netsafe import FetchResult

    url = "https://ide.example.com/oauth/sdk-client.json"
    fetched: list[str] = []

    async def fake_fetch(address: str, **kwargs) -> FetchResult:
        fetched.append(address)
        document = {
            "client_id": url,
            "client_name": "SDK client by CIMD",
            "redirect_uris": [REDIRECT_URI],
            "grant_types": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_method": "none",
        }
        return FetchResult(
            status_code=200,
            reason="OK",
            url=address,
            content_type="application/json",
            body=json.dumps(document).encode(),
            truncated=False,
        )

    monkeypatch.setattr("oauth_server.cimd.safe_fetch", fake_fetch)
    server_url = f"{live_server_url}/mcp/knowledge/"
    person, storage = Person("acme-user", "pw-user-123"), MemoryStorage()
    provider = _provider(server_url, person, storage)
    provider.context.client_metadata_url = url
    names, _ = asyncio.run(_session(server_url, provider, _list_and_call))
    assert names == ["knowledge_bases", "knowledge_search"]
    assert storage.client_info.client_id == url and fetched == [url]
    assert Application.objects.get(client_id=url).name == "SDK client by CIMD"
    assert McpGrant.all_tenants.get().application.client_id == url
