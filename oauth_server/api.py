"""The caller's OAuth grants in the chat app's Settings: ``GET /api/v1/oauth-grants/`` and
``DELETE /api/v1/oauth-grants/<id>/``.

A grant is listed for the membership it acts in (the request's tenant): the user's own grants
in that tenant, exchanged for tokens (a consent whose code was never exchanged is not a grant).
Another user's or another tenant's grant is the same 404 as a missing one.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from oauth_server.models import McpGrant
from oauth_server.services import mcp_grant_revoke
from tenants.api.mixins import TenantScopedApiView


class OAuthGrantOutputSerializer(serializers.ModelSerializer):
    client_name = serializers.SerializerMethodField()
    client_id = serializers.CharField(source="application.client_id")
    tenant = serializers.CharField(source="membership.tenant.name")

    class Meta:
        model = McpGrant
        fields = ["id", "client_name", "client_id", "resource", "scope", "tenant", "created_at", "last_used_at"]

    def get_client_name(self, grant: McpGrant) -> str:
        return grant.application.name or grant.application.client_id


def _grants(request: Request):  # noqa: ANN202  (a queryset)
    return McpGrant.objects.select_related("application", "membership__tenant").filter(
        membership=request.membership, token_family__isnull=False
    )


class OAuthGrantListApi(TenantScopedApiView):
    """The OAuth clients the caller let use an MCP endpoint in this tenant, newest first."""

    @extend_schema(responses=OAuthGrantOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(OAuthGrantOutputSerializer(_grants(request), many=True).data)


class OAuthGrantRevokeApi(TenantScopedApiView):
    """Revoke one grant: its tokens stop working at once (204); 404 when not the caller's."""

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, grant_id: int) -> Response:
        grant = _grants(request).filter(pk=grant_id).first()
        if grant is None:
            raise NotFound("OAuth grant not found.")
        mcp_grant_revoke(grant=grant)
        return Response(status=status.HTTP_204_NO_CONTENT)
