"""The OAuth 2.1 protocol steps of an MCP client, split so a person's browser can sit between
them (the authorization redirect comes back to another request, maybe another process):

1. :func:`discover`: probe the MCP server (``initialize``, then ``tools/list``: a server may
   challenge only its operations); from its ``401`` (``WWW-Authenticate``:
   ``resource_metadata``, ``scope``; that ``scope`` wins over ``scopes_supported``) the
   protected-resource metadata (RFC 9728, with the SEP-985 well-known fallbacks), then the authorization server's metadata (RFC 8414 and
   OpenID discovery, issuers under a path included), its ``issuer`` checked (RFC 8414 §3.3).
2. :func:`register_client`: an admin-entered client, else the platform's Client ID Metadata
   Document (CIMD) where the server supports it, else dynamic registration (RFC 7591).
3. :func:`authorization_request`: PKCE S256, ``state``, ``resource`` (RFC 8707), scopes.
4. :func:`exchange_code` (``iss`` checked first, RFC 9207), :func:`refresh`, :func:`revoke`
   (RFC 7009, when the server offers it).

Without a person: :func:`client_credentials_token` (SEP-1046), the client's secret or a JWT
signed with its private key (``private_key_jwt``, RFC 7523) as its authentication.

The parsing, URL lists and checks are the ``mcp`` SDK's (``mcp.client.auth.utils``, the same
ones its ``OAuthClientProvider`` uses); this module only orders them around the redirect.
No Django imports; the HTTP client is the caller's (the outbound address rules apply to it).
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlparse

import httpx2
from mcp.client.auth import OAuthFlowError, OAuthRegistrationError, OAuthTokenError, PKCEParameters
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    create_client_info_from_metadata_url,
    create_client_registration_request,
    create_oauth_metadata_request,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    get_client_metadata_scopes,
    handle_auth_metadata_response,
    handle_protected_resource_response,
    handle_registration_response,
    handle_token_response_scopes,
    is_valid_client_metadata_url,
    issuers_match,
    should_use_client_metadata_url,
    validate_authorization_response_iss,
    validate_metadata_issuer,
)
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

__all__ = [
    "AuthorizationRequest", "Discovery", "OAuthFlowError", "OAuthRegistrationError", "OAuthTokenError",
    "RefreshRejected", "authorization_request", "client_credentials_token", "discover", "exchange_code", "refresh",
    "register_client", "revoke", "secret_method", "signing_algorithm",
]

GRANT_TYPES = ["authorization_code", "refresh_token"]


class RefreshRejected(OAuthTokenError):
    """The authorization server refused the refresh token (a 4xx such as ``invalid_grant``):
    the person (or an admin) has to connect again. A 5xx or a network error is not this."""


@dataclass(frozen=True, slots=True)
class Discovery:
    """What :func:`discover` found about one MCP server and its authorization server."""

    server_url: str
    resource: str
    """The RFC 8707 resource indicator sent with authorization and token requests."""
    metadata: OAuthMetadata
    """The authorization server's metadata (issuer checked)."""
    scope: str | None
    """The scopes to ask for (the 401's ``scope``, else the resource's, else the server's)."""

    def as_json(self) -> dict[str, Any]:
        """For storage (``McpOAuthConnection.authorization_server``)."""
        return {"server_url": self.server_url, "resource": self.resource, "scope": self.scope,
                "metadata": self.metadata.model_dump(mode="json", exclude_none=True)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Discovery:
        """The inverse of :meth:`as_json`."""
        return cls(server_url=data["server_url"], resource=data["resource"], scope=data.get("scope"),
                   metadata=OAuthMetadata.model_validate(data["metadata"]))


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    """Where to send the person's browser, and what to keep (secret) until it comes back."""

    url: str
    state: str
    code_verifier: str


def _origin(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


PROBE_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
"""The headers of the unauthenticated probe's requests (:func:`_probe`)."""


def _challenge(response: httpx2.Response) -> tuple[str | None, str | None] | None:
    """A 401's (or 403's) ``(resource_metadata, scope)`` from ``WWW-Authenticate``; None for
    any other answer."""
    if response.status_code not in (401, 403):
        return None
    return extract_resource_metadata_from_www_auth(response), extract_scope_from_www_auth(response)


async def _probe(http: httpx2.AsyncClient, server_url: str) -> tuple[str | None, str | None]:
    """Unauthenticated MCP requests until one is challenged: the first 401's (or 403's)
    ``(resource_metadata, scope)``; ``(None, None)`` when none is.

    ``initialize`` first. A server may let the handshake through and guard only its operations
    (the MCP authorization spec allows a challenge on any request), so when ``initialize`` is
    answered, ``notifications/initialized`` and ``tools/list`` follow in its session (the
    ``Mcp-Session-Id`` it gave, if any; the session is deleted afterwards, best effort). Only
    the headers are read (a server that needs no token may answer with a stream). A network
    error on ``initialize`` is raised (``httpx2.HTTPError``); after it, the follow-up requests'
    errors are ignored (no challenge seen).
    """
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "agent-platform", "version": "0.1.0"}}}
    async with http.stream("POST", server_url, json=body, headers=PROBE_HEADERS) as response:
        found = _challenge(response)
        answered = response.is_success
        session = response.headers.get("mcp-session-id", "")
    if found is not None:
        return found
    headers = {**PROBE_HEADERS, **({"Mcp-Session-Id": session} if session else {})}
    try:
        return await _probe_operation(http, server_url, headers, initialized=answered)
    except httpx2.HTTPError:
        return None, None
    finally:
        if session:
            await _delete_session(http, server_url, headers)


async def _probe_operation(http: httpx2.AsyncClient, server_url: str, headers: dict[str, str], *,
                           initialized: bool) -> tuple[str | None, str | None]:
    """After an unchallenged ``initialize``: ``notifications/initialized`` (when it was
    answered) and an unauthenticated ``tools/list``; its challenge, else ``(None, None)``."""
    if initialized:
        async with http.stream("POST", server_url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                               headers=headers) as response:
            found = _challenge(response)
        if found is not None:
            return found
    async with http.stream("POST", server_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                           headers=headers) as response:
        return _challenge(response) or (None, None)


async def _delete_session(http: httpx2.AsyncClient, server_url: str, headers: dict[str, str]) -> None:
    """End the probe's MCP session (a server may not allow it: any answer is fine)."""
    try:
        await http.delete(server_url, headers=headers)
    except httpx2.HTTPError:
        pass


async def discover(http: httpx2.AsyncClient, server_url: str, *, scope: str | None = None) -> Discovery:
    """Protected-resource and authorization-server discovery for ``server_url``.

    Args:
        http: The client to use (follows no redirects; address-checked by the caller's transport).
        server_url: The MCP endpoint.
        scope: The scopes an admin set on the server; None: the discovered ones.

    Returns:
        The :class:`Discovery`.

    Raises:
        OAuthFlowError: no authorization server metadata could be found, its ``issuer`` is not
            the one discovery expected, or the resource metadata names another resource.
        httpx2.HTTPError: the server could not be reached.
    """
    pointer, challenged_scope = await _probe(http, server_url)
    prm = await _resource_metadata(http, server_url, pointer)
    resource = resource_url_from_server_url(server_url)
    auth_server_url: str | None = None
    if prm is not None:
        if prm.resource and not check_resource_allowed(requested_resource=resource,
                                                      configured_resource=str(prm.resource)):
            raise OAuthFlowError(f"The server's resource metadata names another resource: {prm.resource}")
        resource = str(prm.resource) if prm.resource else resource
        auth_server_url = str(prm.authorization_servers[0]) if prm.authorization_servers else None
    metadata = await _authorization_server_metadata(http, server_url, auth_server_url)
    selected = scope or get_client_metadata_scopes(challenged_scope, prm, metadata, GRANT_TYPES)
    return Discovery(server_url=server_url, resource=resource, metadata=metadata, scope=selected)


async def _resource_metadata(http: httpx2.AsyncClient, server_url: str,
                             pointer: str | None) -> ProtectedResourceMetadata | None:
    """RFC 9728 metadata: the 401's pointer first, then the path and root well-known URLs."""
    for url in build_protected_resource_metadata_discovery_urls(pointer, server_url):
        prm = await handle_protected_resource_response(await http.send(create_oauth_metadata_request(url)))
        if prm is not None:
            return prm
    return None


async def _authorization_server_metadata(http: httpx2.AsyncClient, server_url: str,
                                         auth_server_url: str | None) -> OAuthMetadata:
    """RFC 8414 / OpenID discovery of ``auth_server_url`` (None: the MCP server's origin, the
    2025-03-26 way), its ``issuer`` checked. Raises OAuthFlowError when none is found."""
    expected_issuer = auth_server_url or _origin(server_url)
    for url in build_oauth_authorization_server_metadata_discovery_urls(auth_server_url, server_url):
        ok, found = await handle_auth_metadata_response(await http.send(create_oauth_metadata_request(url)))
        if not ok:
            break
        if found is not None:
            if issuers_match(str(found.issuer), expected_issuer):
                expected_issuer = str(found.issuer)
            validate_metadata_issuer(found, expected_issuer)
            return found
    raise OAuthFlowError(f"No authorization server metadata found for {server_url} (issuer {expected_issuer}).")


def client_metadata(*, redirect_uri: str, client_name: str, scope: str | None) -> OAuthClientMetadata:
    """The platform as an OAuth client (public client: PKCE, no secret): what it registers
    dynamically and what its Client ID Metadata Document says."""
    return OAuthClientMetadata(
        redirect_uris=[redirect_uri], client_name=client_name, grant_types=GRANT_TYPES, response_types=["code"],
        token_endpoint_auth_method="none", scope=scope,
    )


def secret_method(metadata: OAuthMetadata) -> str:
    """How a pre-registered client with a secret authenticates at the token endpoint:
    ``client_secret_post``, unless the server lists ``client_secret_basic`` and not post."""
    supported = metadata.token_endpoint_auth_methods_supported or []
    if "client_secret_basic" in supported and "client_secret_post" not in supported:
        return "client_secret_basic"
    return "client_secret_post"


async def register_client(
    http: httpx2.AsyncClient, discovery: Discovery, *, redirect_uri: str, client_name: str,
    client_metadata_url: str | None, client_id: str = "", client_secret: str = "",
) -> OAuthClientInformationFull:
    """The client to authorize as.

    An admin-entered ``client_id`` (with ``client_secret``: ``client_secret_post``, or
    ``client_secret_basic`` where the server's ``token_endpoint_auth_methods_supported`` lists
    basic and not post; without: a public client) wins; else the CIMD URL when the server says
    ``client_id_metadata_document_supported``; else dynamic registration at its
    ``registration_endpoint``.

    Raises:
        OAuthRegistrationError: the server offers neither CIMD nor registration (an admin has to
            enter a client id), or refused the registration.
    """
    if client_id:
        return OAuthClientInformationFull(
            client_id=client_id, client_secret=client_secret or None, redirect_uris=[redirect_uri],
            token_endpoint_auth_method=secret_method(discovery.metadata) if client_secret else "none",
        )
    if is_valid_client_metadata_url(client_metadata_url) and should_use_client_metadata_url(
            discovery.metadata, client_metadata_url):  # the SDK's rule: an https URL with a path
        return create_client_info_from_metadata_url(client_metadata_url or "", redirect_uris=None)
    if discovery.metadata.registration_endpoint is None:
        raise OAuthRegistrationError(
            "The authorization server offers neither client metadata documents nor dynamic registration: "
            "an admin has to enter a client id (and secret) on the MCP server.")
    meta = client_metadata(redirect_uri=redirect_uri, client_name=client_name, scope=discovery.scope)
    request = create_client_registration_request(discovery.metadata, meta, _origin(discovery.server_url))
    return await handle_registration_response(await http.send(request))


def authorization_request(
    discovery: Discovery, client: OAuthClientInformationFull, *, redirect_uri: str, scope: str | None = None,
) -> AuthorizationRequest:
    """The authorization URL (code flow, PKCE S256, ``state``, ``resource``), with its state and
    verifier. ``scope`` (a step-up's union) overrides the discovered scopes."""
    pkce = PKCEParameters.generate()
    state = secrets.token_urlsafe(32)
    params = {
        "response_type": "code", "client_id": client.client_id, "redirect_uri": redirect_uri, "state": state,
        "code_challenge": pkce.code_challenge, "code_challenge_method": "S256", "resource": discovery.resource,
    }
    scope = scope or discovery.scope
    if scope:
        params["scope"] = scope
        if "offline_access" in scope.split():
            params["prompt"] = "consent"  # OpenID Connect Core §11
    endpoint = str(discovery.metadata.authorization_endpoint)
    separator = "&" if urlparse(endpoint).query else "?"
    return AuthorizationRequest(url=f"{endpoint}{separator}{urlencode(params)}", state=state,
                                code_verifier=pkce.code_verifier)


def _client_auth(client: OAuthClientInformationFull, data: dict[str, str]) -> dict[str, str]:
    """The token request's client authentication (RFC 6749 §2.3.1): the headers to add."""
    data["client_id"] = client.client_id
    method = client.token_endpoint_auth_method
    if method == "client_secret_basic" and client.client_secret:
        pair = f"{quote(client.client_id, safe='')}:{quote(client.client_secret, safe='')}"
        return {"Authorization": f"Basic {base64.b64encode(pair.encode()).decode()}"}
    if client.client_secret and method in (None, "client_secret_post"):
        data["client_secret"] = client.client_secret
    return {}


async def _token_request(http: httpx2.AsyncClient, discovery: Discovery, client: OAuthClientInformationFull,
                         data: dict[str, str]) -> OAuthToken:
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json",
               **_client_auth(client, data)}
    response = await http.post(str(discovery.metadata.token_endpoint), data=data, headers=headers)
    if response.status_code not in (200, 201):
        text = response.text[:500]
        error_class = RefreshRejected if data["grant_type"] == "refresh_token" and response.status_code < 500 \
            else OAuthTokenError
        raise error_class(f"The token endpoint answered {response.status_code}: {text}")
    return await handle_token_response_scopes(response)


CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
"""RFC 7523 §2.2: a JWT as the client's authentication at the token endpoint."""


def signing_algorithm(private_key_pem: str) -> str:
    """The JWS algorithm of a PEM private key: ``ES256``/``ES384``/``ES512`` for an EC key on
    P-256/P-384/P-521, ``EdDSA`` for Ed25519, else (RSA) ``RS256``.

    Raises:
        OAuthFlowError: the key cannot be read (not PEM, encrypted, or of another kind).
    """
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(private_key_pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise OAuthFlowError(f"The client's private key is not an unencrypted PEM private key: {exc}") from exc
    if isinstance(key, ec.EllipticCurvePrivateKey):
        curves = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
        if key.curve.name in curves:
            return curves[key.curve.name]
    elif isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    elif isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    raise OAuthFlowError("The client's private key is of a kind the platform does not sign with (EC P-256/384/521, "
                         "Ed25519 or RSA).")


async def client_credentials_token(
    http: httpx2.AsyncClient, discovery: Discovery, client: OAuthClientInformationFull, *,
    scope: str | None = None, private_key_pem: str = "",
) -> OAuthToken:
    """A token for the client itself: the client-credentials grant (OAuth 2.1 §4.2, MCP SEP-1046),
    with ``resource`` (RFC 8707) and ``scope`` (None: the discovered scopes).

    The client authenticates with its secret (``client.token_endpoint_auth_method``:
    ``client_secret_basic`` or ``client_secret_post``), or, given ``private_key_pem``, with a JWT
    it signs (``private_key_jwt``, RFC 7523 §2.2: ``iss`` = ``sub`` = the client id, ``aud`` =
    the authorization server's issuer, ``exp`` 5 minutes on, a fresh ``jti``).

    Raises:
        OAuthFlowError: the private key cannot be used.
        OAuthTokenError: the token endpoint refused (``invalid_client``: wrong credentials).
    """
    data = {"grant_type": "client_credentials", "resource": discovery.resource}
    scope = scope or discovery.scope
    if scope:
        data["scope"] = scope
    if private_key_pem:
        from mcp.client.auth.extensions.client_credentials import SignedJWTParameters

        signer = SignedJWTParameters(issuer=client.client_id, subject=client.client_id, signing_key=private_key_pem,
                                     signing_algorithm=signing_algorithm(private_key_pem))
        data["client_assertion_type"] = CLIENT_ASSERTION_TYPE
        data["client_assertion"] = await signer.create_assertion_provider()(str(discovery.metadata.issuer))
        client = client.model_copy(update={"client_secret": None, "token_endpoint_auth_method": "private_key_jwt"})
    return await _token_request(http, discovery, client, data)


async def exchange_code(
    http: httpx2.AsyncClient, discovery: Discovery, client: OAuthClientInformationFull, *,
    code: str, code_verifier: str, redirect_uri: str, iss: str | None,
) -> OAuthToken:
    """The authorization code for tokens, after checking the response's ``iss`` (RFC 9207).

    Raises:
        OAuthFlowError: ``iss`` names another server, or is missing where the server advertised it.
        OAuthTokenError: the token endpoint refused the code.
    """
    validate_authorization_response_iss(iss, discovery.metadata)
    return await _token_request(http, discovery, client, {
        "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
        "code_verifier": code_verifier, "resource": discovery.resource,
    })


async def refresh(http: httpx2.AsyncClient, discovery: Discovery, client: OAuthClientInformationFull, *,
                  refresh_token: str) -> OAuthToken:
    """A refresh-token grant (with the resource). The answer keeps the old refresh token when
    the server does not rotate it.

    Raises:
        RefreshRejected: a 4xx (``invalid_grant``: revoked or expired): connect again.
        OAuthTokenError: a 5xx or a malformed answer.
    """
    token = await _token_request(http, discovery, client, {
        "grant_type": "refresh_token", "refresh_token": refresh_token, "resource": discovery.resource,
    })
    if token.refresh_token is None:
        token.refresh_token = refresh_token
    return token


async def revoke(http: httpx2.AsyncClient, discovery: Discovery, client: OAuthClientInformationFull, *,
                 tokens: list[tuple[str, str]]) -> bool:
    """RFC 7009 revocation of ``[(token, token_type_hint)]`` at the server's
    ``revocation_endpoint``. False when it has none (nothing sent); errors are the caller's."""
    endpoint = discovery.metadata.revocation_endpoint
    if endpoint is None:
        return False
    for token, hint in tokens:
        data = {"token": token, "token_type_hint": hint}
        headers = {"Content-Type": "application/x-www-form-urlencoded", **_client_auth(client, data)}
        response = await http.post(str(endpoint), data=data, headers=headers)
        if response.status_code >= 400:
            raise OAuthTokenError(f"The revocation endpoint answered {response.status_code}")
    return True
