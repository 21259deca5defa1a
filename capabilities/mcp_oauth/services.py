"""OAuth connections of remote MCP servers: connect (:func:`connection_begin`, then
:func:`connection_complete` from the callback), the token a run uses
(:func:`connection_access_token`: refreshed once per expiry across every worker), disconnect
(:func:`connection_disconnect`: revoked at the server, RFC 7009) and the port the MCP kind uses
(:func:`connection_auth`). A completed connection is handed to the listeners registered with
:func:`connection_made_listen` (a port: the sessions layer resumes the runs waiting for it).

Protocol steps are :mod:`capabilities.mcp_oauth.protocol`; every request goes through the
outbound address rules (:func:`capabilities.netsafe.outbound_transport`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2
from asgiref.sync import async_to_sync, sync_to_async
from django.db import close_old_connections, transaction
from django.utils import timezone
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from capabilities.mcp_oauth import protocol
from capabilities.mcp_oauth.auth import AccessToken, ConnectionAuth, ConnectionRequired
from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.models import McpAuthMode, McpServer
from tenants.crypto import secret_decrypt, secret_encrypt
from tenants.models import Tenant
from tenants.scoping import system_scope, tenant_scope

logger = logging.getLogger(__name__)

T = TypeVar("T")

PENDING_TTL = dt.timedelta(minutes=15)
"""How long an authorization may take (from Connect to the callback)."""

HTTP_TIMEOUT_SECONDS = 20.0
CLIENT_NAME = "Agent Platform"
CALLBACK_PATH = "/mcp-oauth/callback/"
CLIENT_METADATA_PATH = "/mcp-oauth/client-metadata.json"


ConnectionMadeListener = Callable[..., None]
"""``listener(tenant_id=…, server_id=…, user_id=…, actor=…)``: an account was connected
(``user_id`` None: the tenant's), by ``actor``."""
_made_listeners: list[ConnectionMadeListener] = []


def connection_made_listen(listener: ConnectionMadeListener) -> None:
    """Call ``listener`` after every completed connection (:func:`connection_complete`), once
    its row is committed. Registered once per process (an app's ``ready()``); the same callable
    again does nothing. What a listener raises is logged, never passed on: the connection
    stands whatever a listener does."""
    if listener not in _made_listeners:
        _made_listeners.append(listener)


def _connection_made(connection: McpOAuthConnection, actor: Any) -> None:
    for listener in list(_made_listeners):
        try:
            listener(tenant_id=connection.tenant_id, server_id=connection.server_id, user_id=connection.user_id,
                     actor=actor)
        except Exception:  # noqa: BLE001 - the connection is made; a listener's failure is its own
            logger.exception("MCP OAuth connection %s: a listener failed", connection.pk)


class ConnectError(Exception):
    """A connect or callback step failed; ``message`` is for the person (no secrets)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def oauth_http() -> httpx2.AsyncClient:
    """The HTTP client of OAuth requests: outbound address rules, no redirects, no env proxies."""
    from capabilities.netsafe import outbound_transport

    return httpx2.AsyncClient(transport=outbound_transport(), trust_env=False, follow_redirects=False,
                              timeout=httpx2.Timeout(HTTP_TIMEOUT_SECONDS))


def _run(fn: Callable[[httpx2.AsyncClient], Awaitable[T]]) -> T:
    """Run the protocol step ``fn(http)`` from synchronous code (a view, a locked transaction)."""
    async def main() -> T:
        async with oauth_http() as http:
            return await fn(http)
    return async_to_sync(main)()


def _state_hash(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()


def _client(tenant: Tenant, connection: McpOAuthConnection) -> OAuthClientInformationFull:
    return OAuthClientInformationFull.model_validate_json(
        secret_decrypt(tenant=tenant, ciphertext=connection.client_encrypted))


def _discovery(connection: McpOAuthConnection) -> protocol.Discovery:
    return protocol.Discovery.from_json(connection.authorization_server)


def connection_get(*, server: McpServer, user_id: int | None) -> McpOAuthConnection | None:
    """The connection a run of ``user_id`` uses on ``server``: the user's own (``oauth_user``)
    or the tenant's (``oauth_tenant``); None for a server without OAuth or none made yet.
    Requires the server's tenant scope."""
    if server.auth_mode == McpAuthMode.OAUTH_USER:
        if user_id is None:
            return None
        return McpOAuthConnection.objects.filter(server=server, user_id=user_id).first()
    if server.auth_mode in (McpAuthMode.OAUTH_TENANT, McpAuthMode.OAUTH_CLIENT_CREDENTIALS):
        return McpOAuthConnection.objects.filter(server=server, user__isnull=True).first()
    return None


def client_credentials_connection_get_or_create(*, server: McpServer) -> McpOAuthConnection:
    """The tenant's connection row of a client-credentials server (``pending`` and empty when
    new: the first :func:`connection_access_token` gets its token). Requires the server's
    tenant scope."""
    connection, _ = McpOAuthConnection.objects.get_or_create(
        server=server, user=None, defaults={"tenant_id": server.tenant_id, "status": ConnectionStatus.PENDING})
    return connection


def connection_begin(
    *, server: McpServer, user: Any, is_admin: bool, base_url: str, return_to: str = "/",
    scope: str | None = None,
) -> str:
    """Start connecting ``server``: discovery, client registration, a pending connection row
    holding the PKCE verifier and the state's hash; the authorization URL to send the browser to.

    Args:
        server: An HTTP MCP server with ``auth_mode`` ``oauth_user`` or ``oauth_tenant``.
        user: The person connecting (their own account, or the tenant's as an admin).
        is_admin: Whether ``user`` administers the server's tenant (needed for ``oauth_tenant``).
        base_url: This platform's origin as the browser sees it (``https://host``): the
            callback and the Client ID Metadata Document are under it.
        return_to: A local path to send the browser back to afterwards.
        scope: Scopes to ask for instead of the discovered ones (a step-up).

    Raises:
        ConnectError: the server needs no OAuth, the caller may not connect it, or discovery or
            registration failed (the message says which).

    Requires the server's tenant scope.
    """
    if server.auth_mode == McpAuthMode.NONE:
        raise ConnectError(f"The MCP server {server.name!r} does not use OAuth.")
    if server.auth_mode == McpAuthMode.OAUTH_CLIENT_CREDENTIALS:
        raise ConnectError(f"The MCP server {server.name!r} uses the tenant's client credentials: nobody connects "
                           "it, the platform gets its tokens itself.")
    if server.auth_mode == McpAuthMode.OAUTH_TENANT and not is_admin:
        raise ConnectError("Only tenant admins connect the tenant's account.")
    tenant = Tenant.objects.get(pk=server.tenant_id)
    redirect_uri = f"{base_url}{CALLBACK_PATH}"
    existing = connection_get(server=server, user_id=user.pk)
    step_up = existing.requested_scope if existing is not None else ""
    want_scope = protocol_union(server.oauth_scope or None, step_up, scope) if (step_up or scope) \
        else (server.oauth_scope or None)
    secret = secret_decrypt(tenant=tenant, ciphertext=server.oauth_client_secret_encrypted)

    async def steps(http: httpx2.AsyncClient) -> tuple[protocol.Discovery, OAuthClientInformationFull]:
        found = await protocol.discover(http, server.url, scope=want_scope)
        client = await protocol.register_client(
            http, found, redirect_uri=redirect_uri, client_name=f"{CLIENT_NAME} ({tenant.name})",
            client_metadata_url=f"{base_url}{CLIENT_METADATA_PATH}", client_id=server.oauth_client_id,
            client_secret=secret)
        return found, client

    try:
        found, client = _run(steps)
    except (protocol.OAuthFlowError, protocol.OAuthRegistrationError, protocol.OAuthTokenError) as exc:
        raise ConnectError(f"Could not start connecting {server.name!r}: {exc}") from exc
    except httpx2.HTTPError as exc:
        raise ConnectError(f"Could not reach {server.name!r} or its authorization server: {exc}") from exc
    request = protocol.authorization_request(found, client, redirect_uri=redirect_uri)
    _pending_save(server=server, existing=existing, user=user, tenant=tenant, request=request, client=client,
                  stored={**found.as_json(), "redirect_uri": redirect_uri}, return_to=return_to)
    return request.url


@transaction.atomic
def _pending_save(*, server: McpServer, existing: McpOAuthConnection | None, user: Any, tenant: Tenant,
                  request: protocol.AuthorizationRequest, client: OAuthClientInformationFull,
                  stored: dict[str, Any], return_to: str) -> None:
    """The pending authorization on the connection row (a new row: ``pending``; an existing
    one keeps working with its current tokens until the callback replaces them)."""
    connection = existing or McpOAuthConnection(
        tenant_id=server.tenant_id, server=server, user=user if server.auth_mode == McpAuthMode.OAUTH_USER else None,
        status=ConnectionStatus.PENDING)
    connection.pending_state_hash = _state_hash(request.state)
    connection.pending_verifier_encrypted = secret_encrypt(tenant=tenant, plaintext=request.code_verifier)
    local = return_to.startswith("/") and not return_to.startswith("//") and "\\" not in return_to
    connection.pending_return_to = return_to if local else "/"
    connection.pending_started_at = timezone.now()
    connection.pending_by_id = user.pk
    connection.pending_authorization_server = stored
    connection.pending_client_encrypted = secret_encrypt(tenant=tenant, plaintext=client.model_dump_json())
    connection.save()


def protocol_union(*scopes: str | None) -> str | None:
    """Space-separated scopes, merged in order without duplicates (a step-up keeps the grants
    already held)."""
    merged: list[str] = []
    for scope in scopes:
        for item in (scope or "").split():
            if item not in merged:
                merged.append(item)
    return " ".join(merged) or None


def _pending_by_state(state: str) -> McpOAuthConnection:
    # tenant-bypass: the callback arrives without a tenant; the state (32 random bytes, stored
    # hashed) is the capability that names one pending connection, whose tenant is then entered.
    # (Without the system scope, row-level security shows the lookup no row at all.)
    connection = None
    if state:
        with system_scope():
            connection = McpOAuthConnection.all_tenants.filter(pending_state_hash=_state_hash(state)).first()
    if connection is None:
        raise ConnectError("This authorization is unknown or was already used: start connecting again.")
    return connection


def connection_complete(*, state: str, code: str, iss: str | None, user: Any,
                        error: str = "") -> McpOAuthConnection:
    """The callback: check the state (one use, 15 minutes, the same person who started), the
    ``iss`` (RFC 9207), exchange the code (PKCE) and store the tokens, encrypted; then the
    :func:`connection_made_listen` listeners hear of it (runs waiting for it resume).

    Raises:
        ConnectError: an unknown, expired or someone else's state, an authorization error, a
            wrong ``iss``, or a refused exchange. The pending authorization is cleared.
    """
    connection = _pending_by_state(state)
    with tenant_scope(connection.tenant_id):
        tenant = Tenant.objects.get(pk=connection.tenant_id)
        _clear_pending(connection)
        if connection.pending_by_id != getattr(user, "pk", None):
            raise ConnectError("This authorization was started by someone else: sign in as them or start again.")
        started_at = connection.pending_started_at
        if started_at is None or timezone.now() - started_at > PENDING_TTL:
            raise ConnectError("This authorization took too long: start connecting again.")
        if error:
            raise ConnectError(f"The authorization server said: {error[:200]}")
        try:
            discovery = protocol.Discovery.from_json(connection.pending_authorization_server)
            client = OAuthClientInformationFull.model_validate_json(
                secret_decrypt(tenant=tenant, ciphertext=connection.pending_client_encrypted))
        except (KeyError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise ConnectError("This authorization's record is incomplete: start connecting again.") from exc
        verifier = secret_decrypt(tenant=tenant, ciphertext=connection.pending_verifier_encrypted)
        redirect_uri = connection.pending_authorization_server.get("redirect_uri", "")
        try:
            token = _run(lambda http: protocol.exchange_code(
                http, discovery, client, code=code, code_verifier=verifier, redirect_uri=redirect_uri, iss=iss))
        except (protocol.OAuthFlowError, protocol.OAuthTokenError) as exc:
            raise ConnectError(f"The connection failed: {exc}") from exc
        except httpx2.HTTPError as exc:
            raise ConnectError(f"The authorization server could not be reached: {exc}") from exc
        with transaction.atomic():
            locked = McpOAuthConnection.objects.select_for_update().get(pk=connection.pk)
            locked.authorization_server = discovery.as_json()
            locked.client_encrypted = secret_encrypt(tenant=tenant, plaintext=client.model_dump_json())
            _store_token(locked, tenant, token, requested_scope=discovery.scope)
            locked.connected_at = timezone.now()
            locked.requested_scope = ""
            locked.save()
            transaction.on_commit(lambda: _connection_made(locked, user))
        return locked


def _clear_pending(connection: McpOAuthConnection) -> None:
    """One use: the state stops working whatever happens next."""
    McpOAuthConnection.objects.filter(pk=connection.pk).update(
        pending_state_hash="", pending_verifier_encrypted="", pending_client_encrypted="",
        pending_authorization_server={}, pending_started_at=None)


def _store_token(connection: McpOAuthConnection, tenant: Tenant, token: OAuthToken, *,
                 requested_scope: str | None) -> None:
    """Put ``token`` on ``connection`` (not saved): encrypted, with its computed expiry."""
    connection.access_token_encrypted = secret_encrypt(tenant=tenant, plaintext=token.access_token)
    if token.refresh_token:
        connection.refresh_token_encrypted = secret_encrypt(tenant=tenant, plaintext=token.refresh_token)
    connection.token_type = token.token_type or "Bearer"
    connection.scope = token.scope or requested_scope or connection.scope
    connection.expires_at = (timezone.now() + dt.timedelta(seconds=token.expires_in)
                             if token.expires_in is not None else None)
    connection.status = ConnectionStatus.CONNECTED
    connection.last_error = ""


def _current(connection: McpOAuthConnection, tenant: Tenant) -> AccessToken:
    return AccessToken(token=secret_decrypt(tenant=tenant, ciphertext=connection.access_token_encrypted),
                       expires_at=connection.expires_at.timestamp() if connection.expires_at else None)


def _fresh(connection: McpOAuthConnection, tenant: Tenant, refused: str | None) -> AccessToken | None:
    """The stored token when it is usable and not the ``refused`` one."""
    if connection.status != ConnectionStatus.CONNECTED or not connection.access_token_encrypted:
        return None
    current = _current(connection, tenant)
    margin = dt.timedelta(seconds=30)
    if connection.expires_at is not None and connection.expires_at - margin <= timezone.now():
        return None
    return None if refused is not None and current.token == refused else current


def _required(connection: McpOAuthConnection, why: str) -> ConnectionRequired:
    if connection.server.auth_mode == McpAuthMode.OAUTH_CLIENT_CREDENTIALS:
        return ConnectionRequired(f"The MCP server could not be reached with the tenant's client credentials: {why}",
                                  server_id=connection.server_id)
    who = "you" if connection.user_id else "a tenant admin"
    return ConnectionRequired(f"The MCP server needs {who} to connect again: {why}", server_id=connection.server_id)


def connection_access_token(*, tenant_id: int, connection_id: int, refused: str | None = None) -> AccessToken:
    """A usable access token of the connection, refreshed if it has expired (or was ``refused``).

    Single flight across threads, processes and machines: the refresh happens under the row's
    lock (``SELECT … FOR UPDATE``); whoever waited for it finds the new token when it gets the
    lock and uses it, so one expiry costs one refresh request however many runs need it.
    A refused refresh (4xx, e.g. ``invalid_grant``) marks the connection ``reconnect``.

    Raises:
        ConnectionRequired: the connection is missing, not connected, has no refresh token, or
            its refresh was refused.
        protocol.OAuthTokenError, httpx2.HTTPError: the authorization server failed (5xx,
            network): the connection stays as it is, the next call tries again.
    """
    with tenant_scope(tenant_id):
        tenant = Tenant.objects.get(pk=tenant_id)
        connection = McpOAuthConnection.objects.filter(pk=connection_id).first()
        if connection is None:
            raise ConnectionRequired("The MCP server's connection was removed: connect again.")
        quick = _fresh(connection, tenant, refused)
        if quick is not None:
            return quick
        with transaction.atomic():
            locked = McpOAuthConnection.objects.select_for_update().get(pk=connection_id)
            outcome = _refresh_locked(locked, tenant, refused)
            if not isinstance(outcome, AccessToken):  # saved under the lock: waiters see it, no second try
                locked.status, locked.last_error = ConnectionStatus.RECONNECT, outcome[:2000]
                locked.save(update_fields=["status", "last_error", "updated_at"])
        if isinstance(outcome, AccessToken):
            return outcome
        raise _required(locked, outcome)  # raised after the commit (inside, it would roll the status back)


def _refresh_locked(locked: McpOAuthConnection, tenant: Tenant, refused: str | None) -> AccessToken | str:
    """Under the row lock: the token (someone else's fresh one, or refreshed now), or why the
    connection has to be made again.

    Raises:
        ConnectionRequired: the connection is not connected.
        protocol.OAuthTokenError, httpx2.HTTPError: the server failed (5xx, network).
    """
    fresh = _fresh(locked, tenant, refused)
    if fresh is not None:  # another worker refreshed it while we waited for the lock
        return fresh
    server = McpServer.objects.get(pk=locked.server_id)
    if server.auth_mode == McpAuthMode.OAUTH_CLIENT_CREDENTIALS:
        return _client_credentials_locked(locked, tenant, server)
    if locked.status != ConnectionStatus.CONNECTED:
        raise _required(locked, "it is not connected.")
    refresh_token = secret_decrypt(tenant=tenant, ciphertext=locked.refresh_token_encrypted)
    if not refresh_token:
        return "the access token expired and the server gave no refresh token."
    try:
        token = _run(lambda http: protocol.refresh(
            http, _discovery(locked), _client(tenant, locked), refresh_token=refresh_token))
    except protocol.RefreshRejected as exc:
        return f"the authorization server refused to refresh the token ({exc})."
    _store_token(locked, tenant, token, requested_scope=locked.scope)
    locked.refresh_count += 1
    locked.save()
    return _current(locked, tenant)


def _client_credentials_locked(locked: McpOAuthConnection, tenant: Tenant, server: McpServer) -> AccessToken | str:
    """Under the row lock: a new token of the tenant's client (client-credentials grant,
    SEP-1046; discovery done once per server URL and kept on the row), asking for the scopes discovered (or the
    admin's ``oauth_scope``) and any a server's challenge added (``requested_scope``); else why
    it failed (the admin has to check the client's credentials).

    Raises:
        httpx2.HTTPError: the server could not be reached (nothing is marked).
    """
    secret = secret_decrypt(tenant=tenant, ciphertext=server.oauth_client_secret_encrypted)
    private_key = "" if secret else secret_decrypt(tenant=tenant, ciphertext=server.oauth_private_key_encrypted)
    if not server.oauth_client_id or not (secret or private_key):
        return "an admin has to enter the client id and its secret or private key."

    async def steps(http: httpx2.AsyncClient) -> tuple[protocol.Discovery, OAuthClientInformationFull, OAuthToken]:
        known = locked.authorization_server.get("server_url") == server.url  # the URL may have changed since
        found = (_discovery(locked) if known
                 else await protocol.discover(http, server.url, scope=server.oauth_scope or None))
        client = OAuthClientInformationFull(
            client_id=server.oauth_client_id, client_secret=secret or None, redirect_uris=None,
            grant_types=["client_credentials"],
            token_endpoint_auth_method=protocol.secret_method(found.metadata) if secret else "private_key_jwt")
        token = await protocol.client_credentials_token(
            http, found, client, scope=protocol_union(found.scope, locked.requested_scope), private_key_pem=private_key)
        return found, client, token

    try:
        found, client, token = _run(steps)
    except (protocol.OAuthFlowError, protocol.OAuthTokenError) as exc:
        return f"getting a token failed ({exc})."
    locked.authorization_server = found.as_json()
    locked.client_encrypted = secret_encrypt(tenant=tenant, plaintext=client.model_dump_json())
    _store_token(locked, tenant, token, requested_scope=protocol_union(found.scope, locked.requested_scope))
    locked.connected_at = locked.connected_at or timezone.now()
    locked.save()
    return _current(locked, tenant)


def connection_step_up(*, tenant_id: int, connection_id: int, scope: str | None, why: str = "") -> None:
    """The server challenged the connection's token (a 403 ``insufficient_scope``, or a 401 even
    after a fresh token): the connection needs the person again (``reconnect``, ``last_error``:
    ``why``), and the next Connect asks for the union (SEP-2350) of the scopes asked for before
    (``authorization_server["scope"]``: the first Connect's challenged or discovered scopes),
    those granted (``scope``) and the challenge's ``scope``, kept in ``requested_scope``."""
    why = why or f"The server asks for more access: {scope or ''}"
    with tenant_scope(tenant_id):
        with transaction.atomic():
            connection = McpOAuthConnection.objects.select_for_update().filter(pk=connection_id).first()
            if connection is None:
                return
            asked_before = (connection.authorization_server or {}).get("scope")
            connection.requested_scope = protocol_union(
                connection.requested_scope, asked_before, connection.scope, scope) or ""
            connection.status, connection.last_error = ConnectionStatus.RECONNECT, why[:2000]
            connection.save(update_fields=["requested_scope", "status", "last_error", "updated_at"])


def connection_disconnect(*, connection: McpOAuthConnection) -> bool:
    """Revoke the tokens at the authorization server (RFC 7009, when it has a revocation
    endpoint) and delete the connection. Returns whether the server was asked to revoke; a
    failed revocation is logged and the connection deleted anyway. Requires the tenant scope."""
    tenant = Tenant.objects.get(pk=connection.tenant_id)
    revoked = False
    tokens = [(secret_decrypt(tenant=tenant, ciphertext=connection.refresh_token_encrypted), "refresh_token"),
              (secret_decrypt(tenant=tenant, ciphertext=connection.access_token_encrypted), "access_token")]
    tokens = [(token, hint) for token, hint in tokens if token]
    if tokens and connection.authorization_server and connection.client_encrypted:
        try:
            revoked = _run(lambda http: protocol.revoke(
                http, _discovery(connection), _client(tenant, connection), tokens=tokens))
        except (protocol.OAuthTokenError, httpx2.HTTPError) as exc:
            logger.warning("MCP OAuth connection %s: revocation failed: %s", connection.pk, exc)
    connection.delete()
    return revoked


def _in_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` on a worker thread with its own database connection, closed afterwards."""
    def call(**kwargs: Any) -> T:
        close_old_connections()
        try:
            return fn(**kwargs)
        finally:
            from django.db import connection

            connection.close()
    return sync_to_async(call, thread_sensitive=False)


def connection_auth(*, tenant_id: int, server_id: int, connection_id: int) -> ConnectionAuth:
    """The ``httpx2.Auth`` of an MCP connection using this OAuth connection."""
    access_token = _in_thread(connection_access_token)
    step_up = _in_thread(connection_step_up)

    async def source(refused: str | None) -> AccessToken:
        return await access_token(tenant_id=tenant_id, connection_id=connection_id, refused=refused)

    async def on_step_up(scope: str | None, why: str) -> None:
        await step_up(tenant_id=tenant_id, connection_id=connection_id, scope=scope, why=why)

    return ConnectionAuth(source, server_id=server_id, step_up=on_step_up)


def client_metadata_document(*, base_url: str) -> dict[str, Any]:
    """The platform's Client ID Metadata Document (served at ``CLIENT_METADATA_PATH``): its
    ``client_id`` is its own URL."""
    meta = protocol.client_metadata(redirect_uri=f"{base_url}{CALLBACK_PATH}", client_name=CLIENT_NAME, scope=None)
    return {"client_id": f"{base_url}{CLIENT_METADATA_PATH}", "client_uri": base_url,
            **json.loads(meta.model_dump_json(exclude_none=True))}
