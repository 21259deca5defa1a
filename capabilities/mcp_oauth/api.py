"""The caller's OAuth connections to the tenant's MCP servers (REST, ``/api/v1/mcp-connections/``),
the authorization callback (``/mcp-oauth/callback/``) and the platform's Client ID Metadata
Document (``/mcp-oauth/client-metadata.json``).

- ``GET /api/v1/mcp-connections/``: every OAuth MCP server of the caller's tenant with the
  caller's connection state (their own for ``oauth_user``, the tenant's for ``oauth_tenant``).
- ``POST /api/v1/mcp-connections/<server_id>/connect/`` ``{"return_to": "/…"}`` →
  ``{"authorization_url"}``: open it in the browser; the authorization server sends the browser
  back to the callback, which stores the tokens and redirects to ``return_to`` with
  ``mcp_connected=<server_id>`` (or ``mcp_connect_error=<message>``).
- ``DELETE /api/v1/mcp-connections/<server_id>/``: disconnect (tokens revoked at the server,
  RFC 7009, when it offers revocation). A tenant's connection: admins only.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.views.decorators.http import require_GET
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from capabilities.mcp_oauth.models import McpOAuthConnection
from capabilities.mcp_oauth.services import (
    ConnectError,
    client_metadata_document,
    connection_begin,
    connection_complete,
    connection_disconnect,
    connection_get,
)
from capabilities.models import McpAuthMode, McpServer
from tenants.api.mixins import TenantScopedApiView


def _base_url(request: HttpRequest) -> str:
    return request.build_absolute_uri("/").rstrip("/")


def _state(connection: McpOAuthConnection | None) -> str:
    if connection is None or (connection.status == "pending" and not connection.access_token_encrypted):
        return "not_connected"
    return connection.status


class ConnectionSerializer(serializers.Serializer):
    server_id = serializers.IntegerField()
    server_name = serializers.CharField()
    alias = serializers.CharField()
    auth_mode = serializers.ChoiceField(choices=["oauth_user", "oauth_tenant"])
    status = serializers.ChoiceField(
        choices=["not_connected", "connected", "reconnect", "pending"],
        help_text="reconnect: the refresh failed, the grant was revoked or more scopes are needed.")
    scope = serializers.CharField(allow_blank=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    connected_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)
    can_connect = serializers.BooleanField(help_text="Whether the caller may connect or disconnect it.")


def _row(server: McpServer, connection: McpOAuthConnection | None, *, is_admin: bool) -> dict[str, Any]:
    return {
        "server_id": server.pk, "server_name": server.name, "alias": server.alias, "auth_mode": server.auth_mode,
        "status": _state(connection), "scope": connection.scope if connection else "",
        "expires_at": connection.expires_at if connection else None,
        "connected_at": connection.connected_at if connection else None,
        "last_error": connection.last_error if connection else "",
        "can_connect": server.auth_mode == McpAuthMode.OAUTH_USER or is_admin,
    }


def _server(server_id: int) -> McpServer:
    server = McpServer.objects.filter(pk=server_id).exclude(auth_mode=McpAuthMode.NONE).first()
    if server is None:
        raise NotFound("MCP server not found.")
    return server


class McpConnectionListApi(TenantScopedApiView):
    """The tenant's OAuth MCP servers and the caller's connection to each (not the servers the
    platform reaches with the tenant's client credentials: nobody connects those)."""

    @extend_schema(responses=ConnectionSerializer(many=True))
    def get(self, request: Request) -> Response:
        is_admin = request.membership.is_admin
        rows = [
            _row(server, connection_get(server=server, user_id=request.user.pk), is_admin=is_admin)
            for server in McpServer.objects.exclude(auth_mode__in=[McpAuthMode.NONE, McpAuthMode.OAUTH_CLIENT_CREDENTIALS])
            .filter(enabled=True).order_by("name")
        ]
        return Response(ConnectionSerializer(rows, many=True).data)


class McpConnectionConnectApi(TenantScopedApiView):
    """Start connecting the caller's (or, for admins, the tenant's) account to an MCP server."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "McpConnectInput"

        return_to = serializers.CharField(
            required=False, default="/", max_length=500,
            help_text="A local path the browser returns to after the authorization (default /).")

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "McpConnectOutput"

        authorization_url = serializers.URLField()

    @extend_schema(request=InputSerializer, responses=OutputSerializer)
    def post(self, request: Request, server_id: int) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        server = _server(server_id)
        try:
            url = connection_begin(server=server, user=request.user, is_admin=request.membership.is_admin,
                                   base_url=_base_url(request), return_to=data.validated_data["return_to"])
        except ConnectError as exc:
            code = status.HTTP_403_FORBIDDEN if "Only tenant admins" in exc.message else (
                status.HTTP_400_BAD_REQUEST if "client credentials" in exc.message else status.HTTP_502_BAD_GATEWAY)
            raise ApplicationError(exc.message, status_code=code) from exc
        return Response({"authorization_url": url})


class McpConnectionDetailApi(TenantScopedApiView):
    """Disconnect: revoke the tokens at the authorization server and forget them."""

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, server_id: int) -> Response:
        server = _server(server_id)
        if server.auth_mode == McpAuthMode.OAUTH_TENANT and not request.membership.is_admin:
            raise ApplicationError("Only tenant admins disconnect the tenant's account.",
                                   status_code=status.HTTP_403_FORBIDDEN)
        connection = connection_get(server=server, user_id=request.user.pk)
        if connection is None:
            raise NotFound("No connection to this MCP server.")
        connection_disconnect(connection=connection)
        return Response(status=status.HTTP_204_NO_CONTENT)


@require_GET
@login_required(login_url="/")
def oauth_callback(request: HttpRequest) -> HttpResponse:
    """Where the authorization server sends the browser back (``code``, ``state``, ``iss`` or
    ``error``): the tokens are stored and the browser goes to the page it came from."""
    query = request.GET
    try:
        connection = connection_complete(state=query.get("state", ""), code=query.get("code", ""),
                                         iss=query.get("iss"), user=request.user,
                                         error=query.get("error_description") or query.get("error", ""))
    except ConnectError as exc:
        return HttpResponseRedirect(_with_query("/#/settings", mcp_connect_error=exc.message))
    return HttpResponseRedirect(_with_query(connection.pending_return_to or "/", mcp_connected=connection.server_id))


def _with_query(path: str, **params: object) -> str:
    """``path`` with ``params`` added to its query (before any ``#fragment``: the chat app routes
    by fragment, e.g. ``/#/settings``)."""
    path, hash_mark, fragment = path.partition("#")
    separator = "&" if "?" in path else "?"
    return f"{path}{separator}{urlencode(params)}{hash_mark}{fragment}"


@require_GET
def client_metadata(request: HttpRequest) -> JsonResponse:
    """The platform's Client ID Metadata Document: authorization servers that support CIMD
    fetch it to learn the client whose ``client_id`` is this URL."""
    return JsonResponse(client_metadata_document(base_url=_base_url(request)))
