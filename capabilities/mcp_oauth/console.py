"""The console's Connect / Disconnect of an OAuth MCP server (the MCP server's change page):
an admin connects the tenant's service account (``oauth_tenant``) or their own (``oauth_user``)."""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST

from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.mcp_oauth.services import ConnectError, connection_begin, connection_disconnect, connection_get
from capabilities.models import McpAuthMode, McpServer
from tenants.scoping import tenant_scope


def connection_summary(server: McpServer) -> str:
    """One line for the change page: the tenant's connection state, or (per user) how many
    people have connected; a client-credentials server gets its token's status
    (:func:`client_credentials_status`, HTML)."""
    if server.auth_mode == McpAuthMode.NONE:
        return "No OAuth."
    if server.auth_mode == McpAuthMode.OAUTH_CLIENT_CREDENTIALS:
        return client_credentials_status(server)
    with tenant_scope(server.tenant_id):
        if server.auth_mode == McpAuthMode.OAUTH_USER:
            count = McpOAuthConnection.objects.filter(server=server, status="connected").count()
            return (f"Each person connects their own account (chat app: Settings → Connections); "
                    f"{count} connected. Connect here connects yours.")
        connection = connection_get(server=server, user_id=None)
    whose = "The tenant's account"
    if connection is None or not connection.access_token_encrypted:
        return f"{whose}: not connected."
    if connection.status == "reconnect":
        return f"{whose}: connect again ({connection.last_error})."
    until = f", token until {connection.expires_at:%Y-%m-%d %H:%M} UTC" if connection.expires_at else ""
    return f"{whose}: connected (scopes: {connection.scope or '-'}{until})."


def _utc(moment: dt.datetime) -> str:
    return f"{moment.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


def _client_credentials_rows(connection: McpOAuthConnection | None) -> list[tuple[str, str, str]]:
    """``(testid, label, text)`` rows of :func:`client_credentials_status`.

    Only the services write a client-credentials row, and each of their saves either stores a
    new token (status ``connected``) or records why getting one failed (status ``reconnect``,
    ``last_error``; capabilities/mcp_oauth/services.py ``connection_access_token`` and
    ``connection_step_up``), so while the row is ``connected`` its ``updated_at`` is when the
    current token was obtained."""
    if connection is None or (connection.status == ConnectionStatus.PENDING and not connection.access_token_encrypted):
        return [("state", "Token", "none yet: the first run that uses the server gets one.")]
    first = ("first-obtained", "First token", _utc(connection.connected_at) if connection.connected_at else "-")
    if connection.status != ConnectionStatus.CONNECTED:
        return [("state", "Token", "the last request failed: the next run that uses the server tries again."),
                ("last-error", "Last error", f"{_utc(connection.updated_at)}: {connection.last_error or '-'}"),
                first]
    if connection.expires_at is None:
        expires = "not said by the authorization server (kept until the MCP server refuses it)"
    elif connection.expires_at <= timezone.now():
        expires = f"{_utc(connection.expires_at)} (expired: the next run gets a new one)"
    else:
        expires = _utc(connection.expires_at)
    return [("state", "Token", f"obtained (scopes: {connection.scope or '-'})"),
            ("obtained", "Last obtained", _utc(connection.updated_at)),
            ("expires", "Expires", expires),
            ("last-error", "Last error", "none"),
            first]


def client_credentials_status(server: McpServer) -> str:
    """The tenant's token of a client-credentials server (``oauth_client_credentials``) for
    its change page: whether a token was obtained, when (last and first), until when, and the
    last error of a failed token request. Nothing secret is shown (no token, no client secret).

    Returns:
        HTML (escaped, safe): ``<dl data-testid="mcp-oauth-status">`` with a ``<dt>``/``<dd>``
        pair per row, each ``<dd data-testid="mcp-oauth-<row>">`` (``state``, ``obtained``,
        ``expires``, ``last-error``, ``first-obtained``); times in UTC.

    Reads the row in the server's tenant scope; the caller has checked the admin may see the
    server (McpServerAdmin's queryset is scoped to the admin's tenants).
    """
    with tenant_scope(server.tenant_id):
        connection = connection_get(server=server, user_id=None)
    rows = format_html_join("", '<dt>{}</dt><dd data-testid="mcp-oauth-{}">{}</dd>',
                            ((label, testid, text) for testid, label, text in _client_credentials_rows(connection)))
    return format_html('<p>The tenant\'s client (client credentials; nobody connects).</p>'
                       '<dl class="console-oauth-status" data-testid="mcp-oauth-status">{}</dl>', rows)


def _change_page(server: McpServer) -> str:
    return reverse("admin:capabilities_mcpserver_change", args=[server.pk])


@require_POST
def console_connect(request: HttpRequest, server: McpServer | None) -> HttpResponse:
    """POST from the change page: start the authorization and send the browser to it; the
    callback brings it back to the change page."""
    if server is None or server.auth_mode == McpAuthMode.NONE:
        raise Http404("MCP server not found.")
    with tenant_scope(server.tenant_id):
        try:
            url = connection_begin(server=server, user=request.user, is_admin=True,
                                   base_url=request.build_absolute_uri("/").rstrip("/"),
                                   return_to=_change_page(server))
        except ConnectError as exc:
            messages.error(request, exc.message)
            return HttpResponseRedirect(_change_page(server))
    return HttpResponseRedirect(url)


@require_POST
def console_disconnect(request: HttpRequest, server: McpServer | None) -> HttpResponse:
    """POST from the change page: revoke and forget the connection (the tenant's, or the admin's own)."""
    if server is None or server.auth_mode == McpAuthMode.NONE:
        raise Http404("MCP server not found.")
    with tenant_scope(server.tenant_id):
        connection = connection_get(server=server, user_id=request.user.pk)
        if connection is not None:
            revoked = connection_disconnect(connection=connection)
            messages.success(request, "Disconnected" + (" (revoked at the server)." if revoked else "."))
    return HttpResponseRedirect(f"{_change_page(server)}?{urlencode({'disconnected': 1})}")
