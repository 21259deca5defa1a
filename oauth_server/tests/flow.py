"""The OAuth steps a client takes, for tests (Django's test client; ``base`` is its origin)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from html import unescape
from urllib.parse import parse_qs, urlencode, urlsplit

REDIRECT_URI = "http://127.0.0.1:33418/callback"


@dataclass
class Pkce:
    verifier: str
    challenge: str


def pkce() -> Pkce:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return Pkce(verifier=verifier, challenge=challenge)


def register(client, *, redirect_uri: str = REDIRECT_URI, name: str = "Test IDE") -> dict:
    """RFC 7591 registration of a public client; its response document."""
    response = client.post(
        "/oauth/register/",
        data=json.dumps(
            {
                "redirect_uris": [redirect_uri],
                "client_name": name,
                "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
            }
        ),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def authorize_params(
    client_id: str,
    resource: str,
    challenge: str,
    *,
    method: str = "S256",
    redirect_uri: str = REDIRECT_URI,
    state: str = "st-1",
) -> dict[str, str]:
    return {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": method,
        "resource": resource,
        "scope": "mcp",
    }


def hidden_fields(html: str) -> dict[str, str]:
    """The consent form's hidden inputs (and the CSRF token)."""
    fields = {}
    for tag in re.findall(r"<input[^>]*>", html):
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name and 'type="hidden"' in tag:
            fields[name.group(1)] = unescape(value.group(1)) if value else ""
    return fields


def consent(client, params: dict[str, str], *, membership_id: int | None, allow: bool = True):
    """GET the consent page (signed in), then POST the decision; the final response."""
    page = client.get("/oauth/authorize/?" + urlencode(params))
    assert page.status_code == 200, page.content[:500]
    fields = hidden_fields(page.content.decode())
    if allow:
        fields["allow"] = "on"
    if membership_id is not None:
        fields["membership"] = str(membership_id)
    return client.post("/oauth/authorize/", fields)


def redirect_query(response) -> dict[str, str]:
    assert response.status_code == 302, response.content[:500]
    return {k: v[0] for k, v in parse_qs(urlsplit(response["Location"]).query).items()}


def exchange(client, *, client_id: str, code: str, verifier: str, resource: str, redirect_uri: str = REDIRECT_URI):
    return client.post(
        "/oauth/token/",
        {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "resource": resource,
        },
    )


def refresh(client, *, client_id: str, refresh_token: str, resource: str):
    return client.post(
        "/oauth/token/",
        {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id, "resource": resource},
    )


def tokens_for(client, membership, *, resource: str, name: str = "Test IDE") -> tuple[str, dict]:
    """The whole dance for ``membership``'s user (signed in on ``client``): client id and token
    response."""
    client.force_login(membership.user)
    registered = register(client, name=name)
    codes = pkce()
    answer = redirect_query(
        consent(
            client, authorize_params(registered["client_id"], resource, codes.challenge), membership_id=membership.pk
        )
    )
    token = exchange(
        client, client_id=registered["client_id"], code=answer["code"], verifier=codes.verifier, resource=resource
    )
    assert token.status_code == 200, token.content
    return registered["client_id"], token.json()
