"""The console's Connect / Disconnect of an OAuth MCP server (the MCP server's change page):
an admin connects the tenant's service account (``oauth_tenant``) or their own (``oauth_user``)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.mcp_oauth.services import ConnectError, connection_begin, connection_disconnect, connection_get
from capabilities.models import McpAuthMode, McpServer
from tenants.scoping import tenant_scope


def connection_summary(server: McpServer) -> str:
    """One line for the change page: the tenant's connection state, or (per user) how many
    people have connected."""
    if server.auth_mode == McpAuthMode.NONE:
        return "No OAuth."
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
