"""End-user endpoints for memory: what an agent remembers about the caller, and deleting it.

Every endpoint works on the caller's own memories in the caller's tenant: another user's
memory, or another tenant's, is "Memory not found." exactly like a missing one.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from memory.models import Memory
from memory.selectors import memory_agent_visible, memory_get_for_user, memory_list_for_user, memory_policy_for_agent
from memory.services import memory_delete, memory_delete_all
from sessions.selectors import chat_session_get_for_user
from tenants.api.mixins import TenantScopedApiView


class MemorySerializer(serializers.ModelSerializer):
    class Meta:
        model = Memory
        fields = ["id", "agent", "text", "category", "source_session", "created_at", "updated_at", "last_used_at"]


def _agent_param(request: Request, *, required: bool) -> int | None:
    raw = request.query_params.get("agent")
    if raw is None:
        if required:
            raise serializers.ValidationError({"agent": ["An agent id is required."]})
        return None
    if not raw.isdigit():
        raise serializers.ValidationError({"agent": ["An agent id (an integer)."]})
    if memory_agent_visible(agent_id=int(raw)) is None:
        raise NotFound("Agent not found.")
    return int(raw)


class MemoryListApi(TenantScopedApiView):
    """GET: the caller's memories (``?agent=<id>``: with one agent), newest first, paginated;
    with ``agent``, the page also says whether that agent has memory on (``memory_enabled``).
    DELETE ``?agent=<id>``: forget everything that agent remembers about the caller."""

    @extend_schema(
        operation_id="v1_memories_list",
        parameters=[OpenApiParameter("agent", int, required=False, description="Only memories with this agent.")],
        responses=inline_serializer("PaginatedMemoryList", {
            "count": serializers.IntegerField(), "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True), "results": MemorySerializer(many=True),
            "memory_enabled": serializers.BooleanField(
                required=False, help_text="With ?agent=: whether that agent has memory on."),
        }),
    )
    def get(self, request: Request) -> Response:
        agent_id = _agent_param(request, required=False)
        memories = memory_list_for_user(user_id=request.user.pk, agent_id=agent_id)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(memories, request, view=self)
        response = paginator.get_paginated_response(MemorySerializer(page, many=True).data)
        if agent_id is not None:
            response.data["memory_enabled"] = memory_policy_for_agent(agent_id=agent_id) is not None
        return response

    @extend_schema(
        operation_id="v1_memories_destroy_all",
        parameters=[OpenApiParameter("agent", int, required=True, description="The agent whose memories go.")],
        responses=inline_serializer("MemoryDeleteAll", {"deleted": serializers.IntegerField()}),
    )
    def delete(self, request: Request) -> Response:
        agent_id = _agent_param(request, required=True)
        return Response({"deleted": memory_delete_all(user_id=request.user.pk, agent_id=agent_id)})


class MemoryDetailApi(TenantScopedApiView):
    """DELETE: forget one of the caller's memories (404 for another user's or tenant's)."""

    @extend_schema(responses={204: None})
    def delete(self, request: Request, memory_id: int) -> Response:
        memory = memory_get_for_user(memory_id=memory_id, user_id=request.user.pk)
        if memory is None:
            raise NotFound("Memory not found.")
        memory_delete(memory=memory)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemoryExtractApi(TenantScopedApiView):
    """POST ``{"session": <id>}``: extract memories from one of the caller's sessions now (queued;
    202). 404 for another user's session; 409 when the session's agent has memory off. Spends
    the ``messages`` budget (it calls the agent's model)."""

    throttle_scopes = ("messages",)

    class InputSerializer(serializers.Serializer):
        session = serializers.IntegerField(min_value=1)

    @extend_schema(request=InputSerializer,
                   responses={202: inline_serializer("MemoryExtractQueued", {"queued": serializers.BooleanField()})})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = chat_session_get_for_user(session_id=data.validated_data["session"], user_id=request.user.pk)
        if session is None:
            raise NotFound("Session not found.")
        if memory_policy_for_agent(agent_id=session.agent_id) is None:
            raise ApplicationError("Memory is off for this agent.", status_code=status.HTTP_409_CONFLICT)
        from memory.tasks import memory_extract_session

        memory_extract_session.delay(session.pk, session.tenant_id, True)
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)
