"""The redirect-URI rule (oauth_server/redirects.py) on every path: dynamic registration, a
Client ID Metadata Document, the authorization request (for a client stored before the rule),
and the consent page's CSP ``form-action``."""

from __future__ import annotations

import json
import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from oauth2_provider.models import get_application_model

from capabilities.netsafe import FetchResult
from oauth_server.redirects import redirect_uri_problem
from oauth_server.tests import flow

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

AGENTS = "http://testserver/mcp/agents/"

ACCEPTED = [
    "https://app.example.com/oauth/callback",
    "http://127.0.0.1:33418/callback",
    "http://[::1]:8080/cb",
    "http://localhost:5173/cb",
    "com.example.app:/oauth2redirect",
    "cursor://anysphere.cursor-retrieval/oauth/callback",
    "vscode://vscode.github-authentication/did-authenticate",
]
REFUSED = [
    "http://app.example.com/callback",  # plain http off loopback
    "http://127.0.0.1.attacker.example/cb",
    "javascript:alert(document.cookie)",
    "javascript://example.com/%0aalert(1)",
    "data:text/html,<script>alert(1)</script>",
    "file:///etc/passwd",
    "vbscript:msgbox(1)",
    "about:blank",
    "blob:https://app.example.com/0b1c",
    "https://app.example.com/cb#fragment",
    "com.example.app:/cb#x",
    "https://user@app.example.com/cb",
]


def _register(client: Client, uri: str):
    return client.post(
        "/oauth/register/",
        data=json.dumps(
            {
                "redirect_uris": [uri],
                "client_name": "IDE",
                "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
            }
        ),
        content_type="application/json",
    )


@pytest.mark.parametrize("uri", ACCEPTED)
def test_registration_accepts(uri):
    response = _register(Client(), uri)
    assert response.status_code == 201, response.content
    assert response.json()["redirect_uris"] == [uri]


@pytest.mark.parametrize("uri", REFUSED)
def test_registration_refuses(uri):
    response = _register(Client(), uri)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_client_metadata"
    assert not get_application_model().objects.filter(redirect_uris=uri).exists()


@pytest.mark.parametrize("uri", REFUSED)
def test_the_rule_refuses(uri):
    assert redirect_uri_problem(uri) is not None


def test_a_custom_scheme_client_completes_the_flow_and_its_page_allows_the_scheme(world):
    """A native app's private-use scheme: registered, consented, redirected to with the code
    (DOT's redirect response refuses a scheme not allowed for the client), and the consent
    page's CSP form-action names the scheme (the browser checks the form's redirect)."""
    uri = "cursor://anysphere.cursor-retrieval/oauth/callback"
    client = Client()
    client.force_login(world.member)
    registered = flow.register(client, redirect_uri=uri)
    codes = flow.pkce()
    params = flow.authorize_params(registered["client_id"], AGENTS, codes.challenge, redirect_uri=uri)
    page = client.get("/oauth/authorize/", params)
    assert page.status_code == 200
    assert "form-action 'self' cursor:;" in page["Content-Security-Policy"] + ";"
    answer = flow.consent(client, params, membership_id=world.member_membership.pk)
    assert answer.status_code == 302 and answer["Location"].startswith(uri + "?")
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    token = flow.exchange(
        client, client_id=registered["client_id"], code=code, verifier=codes.verifier, resource=AGENTS, redirect_uri=uri
    )
    assert token.status_code == 200, token.content


def test_a_reverse_domain_scheme_gets_a_scheme_source_in_the_csp(world):
    uri = "com.example.app:/oauth2redirect"
    client = Client()
    client.force_login(world.member)
    registered = flow.register(client, redirect_uri=uri)
    page = client.get(
        "/oauth/authorize/", flow.authorize_params(registered["client_id"], AGENTS, "x" * 43, redirect_uri=uri)
    )
    assert "form-action 'self' com.example.app:;" in page["Content-Security-Policy"] + ";"


@pytest.mark.parametrize("uri", ["http://attacker.example/cb", "javascript://x/%0aalert(1)"])
def test_a_client_stored_before_the_rule_is_not_redirected_to_a_refused_uri(world, uri):
    """A row written without ``clean`` (an old registration): the authorization request is
    refused with an error page, never a redirect there, and the consent page allows no form
    target."""
    application = get_application_model().objects.create(
        name="old",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris=uri,
        client_secret="",
    )
    client = Client()
    client.force_login(world.member)
    params = flow.authorize_params(application.client_id, AGENTS, flow.pkce().challenge, redirect_uri=uri)
    response = client.get("/oauth/authorize/", params)
    assert response.status_code == 400
    assert not response.has_header("Location")
    assert "attacker.example" not in response.get("Content-Security-Policy", "")


@pytest.mark.parametrize(
    ("uri", "allowed"),
    [("http://ide.example.com/cb", False), ("data:text/html,x", False), ("cursor://ide/cb", True)],
)
def test_a_metadata_document_is_held_to_the_rule(world, monkeypatch, uri, allowed):
    url = f"https://ide.example.com/oauth/{uuid.uuid4().hex}.json"
    document = {
        "client_id": url,
        "client_name": "Doc IDE",
        "redirect_uris": [uri],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
    }

    async def fake_fetch(target: str, **kwargs) -> FetchResult:
        return FetchResult(
            status_code=200,
            reason="OK",
            url=target,
            content_type="application/json",
            body=json.dumps(document).encode(),
            truncated=False,
        )

    monkeypatch.setattr("oauth_server.cimd.safe_fetch", fake_fetch)
    client = Client()
    client.force_login(world.member)
    response = client.get("/oauth/authorize/", flow.authorize_params(url, AGENTS, "x" * 43, redirect_uri=uri))
    if allowed:
        assert response.status_code == 200, response.content[:300]
    else:
        assert response.status_code == 400 and not response.has_header("Location")


def test_a_registration_update_is_held_to_the_rule():
    """RFC 7592 PUT (``/oauth/register/<client_id>/``) goes through the same rule."""
    client = Client()
    registered = flow.register(client)
    url = f"/oauth/register/{registered['client_id']}/"
    auth = {"HTTP_AUTHORIZATION": f"Bearer {registered['registration_access_token']}"}
    body = {
        "redirect_uris": ["http://attacker.example/cb"],
        "client_name": "IDE",
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
    }
    refused = client.put(url, data=json.dumps(body), content_type="application/json", **auth)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_client_metadata"
    body["redirect_uris"] = ["vscode://example.ide/callback"]
    accepted = client.put(url, data=json.dumps(body), content_type="application/json", **auth)
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["redirect_uris"] == ["vscode://example.ide/callback"]
