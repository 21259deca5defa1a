"""MCP resources pinned to a chat: ``GET/POST /api/v1/sessions/<id>/pinned-resources/`` and
``DELETE /api/v1/sessions/<id>/pinned-resources/<pin id>/`` (:mod:`sessions.pinned_resources`).

The caller's own chat only: another user's or tenant's chat is a 404 "Session not found.", as
a missing one (:func:`sessions.api.views.session_or_404`); another chat's pin is a 404
"Pinned resource not found.".
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError
from capabilities.mcp.resources import MAX_URI_CHARS
from sessions.api.views import session_or_404
from sessions.pinned_resources import pinned_resource_create, pinned_resource_delete, pinned_resource_list
from tenants.api.mixins import TenantScopedApiView


class PinnedResourceSerializer(serializers.Serializer):
    """One pin, as listed."""

    class Meta:
        ref_name = "PinnedResource"

    id = serializers.IntegerField()
    server = serializers.CharField(help_text="The MCP server's name (its alias).")
    server_id = serializers.IntegerField()
    binding = serializers.IntegerField(allow_null=True, help_text="The agent's binding of the server; null: not bound any more.")
    uri = serializers.CharField()
    bound = serializers.BooleanField(help_text="The server is still bound to the chat's agent and enabled: runs read "
                                               "the pin (false: it is kept but left out).")
    updated = serializers.BooleanField(help_text="The chat's last run read it again because its server said it "
                                                 "changed since the run before (servers that announce updates only).")
    created_at = serializers.DateTimeField()


class PinnedResourceListCreateApi(TenantScopedApiView):
    """The resources pinned to one of the caller's chats (GET), or pin one (POST ``{binding or
    server, uri}``): every later run of the chat reads it when it starts, as a resource attached
    to a message is read (at most 10 pins a chat; pinning a pinned one again answers it, 200)."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PinnedResourceInput"

        binding = serializers.IntegerField(required=False, allow_null=True,
                                           help_text="The agent's MCP binding (from GET /api/v1/agents/<id>/resources/).")
        server = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                       help_text="Or the server's alias, name or id.")
        uri = serializers.CharField(trim_whitespace=True,
                                    help_text=f"The resource's absolute URI (a template's, filled in; at most "
                                              f"{MAX_URI_CHARS:,} characters).")

    @extend_schema(responses={200: inline_serializer("PinnedResourceList",
                                                     {"results": PinnedResourceSerializer(many=True)})})
    def get(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        return Response({"results": PinnedResourceSerializer(pinned_resource_list(session=session), many=True).data})

    @extend_schema(request=InputSerializer, responses={201: PinnedResourceSerializer, 200: PinnedResourceSerializer})
    def post(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        data = self.InputSerializer(data=request.data)
        if not data.is_valid():
            field, errors = next(iter(data.errors.items()))
            raise ApplicationError(f"{field}: {errors[0]}", extra={"field": field})
        pin, created = pinned_resource_create(session=session, uri=data.validated_data["uri"],
                                              binding=data.validated_data.get("binding"),
                                              server=data.validated_data.get("server"))
        item = next(p for p in pinned_resource_list(session=session) if p["id"] == pin.pk)
        return Response(PinnedResourceSerializer(item).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class PinnedResourceDeleteApi(TenantScopedApiView):
    """Unpin a resource of one of the caller's chats (later runs do not read it). 204."""

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, session_id: int, pin_id: int) -> Response:
        session = session_or_404(request, session_id)
        pinned_resource_delete(session=session, pin_id=pin_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
