"""Client ID Metadata Documents: a client_id that is an https URL is a client once its document
(fetched through capabilities.netsafe) names that same URL and the redirect URI; a private
address, a mismatching document or a redirect URI it does not list is refused."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from capabilities import netsafe
from capabilities.netsafe import FetchError, FetchResult
from oauth_server.tests import flow

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

AGENTS = "http://testserver/mcp/agents/"


def _url() -> str:
    # a new URL each time: a failed document is backed off per URL in the cache
    return f"https://ide.example.com/oauth/{uuid.uuid4().hex}.json"


@pytest.fixture
def documents(monkeypatch):
    """URL → the document the fake fetch answers; the fetches made, in order."""
    served: dict[str, dict] = {}
    fetched: list[str] = []

    async def fake_fetch(url: str, **kwargs) -> FetchResult:
        fetched.append(url)
        return FetchResult(
            status_code=200,
            reason="OK",
            url=url,
            content_type="application/json",
            body=json.dumps(served[url]).encode(),
            truncated=False,
        )

    monkeypatch.setattr("oauth_server.cimd.safe_fetch", fake_fetch)
    return served, fetched


def _document(url: str, **extra) -> dict:
    return {
        "client_id": url,
        "client_name": "Example IDE",
        "redirect_uris": [flow.REDIRECT_URI],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        **extra,
    }


def test_a_metadata_document_makes_the_client(world, documents):
    served, fetched = documents
    url = _url()
    served[url] = _document(url)
    client = Client()
    client.force_login(world.member)
    codes = flow.pkce()
    params = flow.authorize_params(url, AGENTS, codes.challenge)
    page = client.get("/oauth/authorize/", params)
    assert page.status_code == 200 and "Example IDE" in page.content.decode()
    assert fetched == [url]
    answer = flow.redirect_query(flow.consent(client, params, membership_id=world.member_membership.pk))
    token = flow.exchange(client, client_id=url, code=answer["code"], verifier=codes.verifier, resource=AGENTS)
    assert token.status_code == 200, token.content


@pytest.mark.parametrize(
    "change",
    [
        {"client_id": "https://ide.example.com/someone-else.json"},
        {"redirect_uris": ["http://127.0.0.1:9/other"]},
        {"token_endpoint_auth_method": "client_secret_basic"},
    ],
)
def test_a_document_that_does_not_match_is_refused(world, documents, change):
    served, _ = documents
    url = _url()
    served[url] = {**_document(url), **change}
    client = Client()
    client.force_login(world.member)
    response = client.get("/oauth/authorize/", flow.authorize_params(url, AGENTS, flow.pkce().challenge))
    assert response.status_code == 400 and not response.has_header("Location")


def test_a_private_address_is_refused_by_the_address_check(world, monkeypatch):
    """The real fetch through capabilities.netsafe: 10.0.0.0/8 is not reachable (blocked before
    any connection), so the client is unknown."""
    seen: list[str] = []
    real = netsafe.safe_fetch

    async def spy(url: str, **kwargs):
        try:
            return await real(url, **kwargs)
        except FetchError as exc:
            seen.append(exc.code)
            raise

    monkeypatch.setattr("oauth_server.cimd.safe_fetch", spy)
    client = Client()
    client.force_login(world.member)
    url = f"https://10.20.30.40/oauth/{uuid.uuid4().hex}.json"
    response = client.get("/oauth/authorize/", flow.authorize_params(url, AGENTS, flow.pkce().challenge))
    assert response.status_code == 400 and not response.has_header("Location")
    assert seen == ["blocked_address"]
