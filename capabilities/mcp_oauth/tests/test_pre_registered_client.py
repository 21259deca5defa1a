"""An admin-entered (pre-registered) client with a secret authenticates at the token endpoint
the way the authorization server says it accepts: ``client_secret_post`` unless its metadata
lists ``client_secret_basic`` and not post (the conformance suite's ``auth/pre-registration``)."""

from __future__ import annotations

import asyncio
import base64

import httpx2
import pytest
from mcp.shared.auth import OAuthMetadata

from capabilities.mcp_oauth import protocol


def _discovery(methods: list[str] | None) -> protocol.Discovery:
    metadata = OAuthMetadata.model_validate({
        "issuer": "https://as.example", "authorization_endpoint": "https://as.example/authorize",
        "token_endpoint": "https://as.example/token", "response_types_supported": ["code"],
        **({"token_endpoint_auth_methods_supported": methods} if methods is not None else {})})
    return protocol.Discovery(server_url="https://mcp.example/mcp", resource="https://mcp.example/mcp",
                              metadata=metadata, scope=None)


def _token_request(methods: list[str] | None) -> httpx2.Request:
    """The code exchange of a pre-registered client (id ``app``, secret ``s3cret``), as sent."""
    sent: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, json={"access_token": "t", "token_type": "Bearer"})

    async def main() -> None:
        discovery = _discovery(methods)
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as http:
            client = await protocol.register_client(
                http, discovery, redirect_uri="https://platform.example/cb", client_name="P",
                client_metadata_url=None, client_id="app", client_secret="s3cret")
            await protocol.exchange_code(http, discovery, client, code="c", code_verifier="v",
                                         redirect_uri="https://platform.example/cb", iss=None)
    asyncio.run(main())
    [request] = sent
    return request


@pytest.mark.parametrize("methods", [None, ["client_secret_post"], ["client_secret_basic", "client_secret_post"]])
def test_the_secret_goes_in_the_form_unless_the_server_takes_basic_only(methods):
    request = _token_request(methods)
    assert "authorization" not in request.headers
    assert b"client_secret=s3cret" in request.content


def test_a_server_taking_basic_only_gets_basic_authentication():
    request = _token_request(["client_secret_basic"])
    assert request.headers["authorization"] == f"Basic {base64.b64encode(b'app:s3cret').decode()}"
    assert b"client_secret" not in request.content
