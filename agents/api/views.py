"""Agents: the list end users pick from, and tenant-admin CRUD for agents and bindings."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance, AgentVersion, CapabilityBinding
from agents.selectors import agent_list_active
from agents.services import agent_save, binding_save
from agents.versions import VersionError, config_diff, version_publish, versions_batch
from capabilities.models import CliCommand, McpServer, Skill
from capabilities.registry import BINDING_FIELDS
from llm.models import ModelRoute
from tenants.api.mixins import TenantContextMixin, TenantPrimaryKeyRelatedField, TenantScopedViewSet
from tenants.audit import Action, audit_record


class AgentOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = AgentInstance
        fields = ["id", "name", "slug", "description"]


class AgentListApi(TenantContextMixin, ListAPIView):
    """Active agents of the caller's tenant."""

    serializer_class = AgentOutputSerializer

    def get_queryset(self):
        return agent_list_active()

    @extend_schema(responses=AgentOutputSerializer(many=True))
    def get(self, request: Request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class AgentAdminSerializer(serializers.ModelSerializer):
    route = TenantPrimaryKeyRelatedField(ModelRoute)

    class Meta:
        model = AgentInstance
        fields = [
            "id", "name", "slug", "description", "system_prompt", "route", "max_loop_count", "tool_max_parallel",
            "tool_timeout_seconds", "turn_timeout_seconds", "run_timeout_seconds", "message_mode", "max_tokens_per_run",
            "max_cost_per_run_usd", "is_active", "a2a_public", "output_schema", "output_repairs", "routing_rules",
            "created_at", "updated_at",
        ]


class AgentVersionSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = AgentVersion
        fields = ["number", "content_hash", "note", "created_by", "created_at", "config"]


class PublishInputSerializer(serializers.Serializer):
    version = serializers.IntegerField(required=False, min_value=1, help_text="Version number; default: the draft.")
    note = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class RollbackInputSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="The earlier version to publish again.")


def _version_state(agent: AgentInstance) -> dict:
    """``{published, draft}``: the agent's published and draft version numbers (None: none)."""
    numbers = dict(AgentVersion.all_tenants.filter(
        pk__in=[v for v in (agent.published_version_id, agent.draft_version_id) if v]).values_list("pk", "number"))
    return {"published": numbers.get(agent.published_version_id), "draft": numbers.get(agent.draft_version_id)}


class AgentViewSet(TenantScopedViewSet):
    """Agents (tenant admins): CRUD, and their versions: list, diff, publish, rollback
    (:mod:`agents.versions`). Each saved change makes a version by the caller."""

    model = AgentInstance
    serializer_class = AgentAdminSerializer

    def perform_create(self, serializer):
        with versions_batch(user=self.request.user, note="Created"):
            serializer.instance = agent_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer):
        with versions_batch(user=self.request.user):
            serializer.instance = agent_save(tenant=self.request.tenant, agent=serializer.instance,
                                             **serializer.validated_data)

    @extend_schema(responses=AgentVersionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request: Request, pk: str | None = None) -> Response:
        """``GET …/agents/<id>/versions/``: the agent's versions, newest first, with
        ``published`` and ``draft`` numbers."""
        agent = self.get_object()
        rows = AgentVersion.objects.filter(agent=agent).select_related("created_by").order_by("-number")
        return Response({**_version_state(agent), "versions": AgentVersionSerializer(rows, many=True).data})

    @extend_schema(parameters=[OpenApiParameter("against", int, description="The other version (default: n - 1).")],
                   responses={200: dict})
    @action(detail=True, methods=["get"], url_path=r"versions/(?P<number>[0-9]+)/diff")
    def version_diff(self, request: Request, pk: str | None = None, number: str = "") -> Response:
        """``GET …/versions/<n>/diff/?against=<m>``: per field that differs from version ``m``
        to ``n``, ``{field, before, after, diff}`` (``diff``: unified diff lines)."""
        agent = self.get_object()
        against = request.query_params.get("against", str(int(number) - 1))
        if not against.isdigit():
            raise ApplicationError("`against` must be a version number.")
        versions = AgentVersion.objects.filter(agent=agent)
        after = get_object_or_404(versions, number=int(number))
        before = versions.filter(number=int(against)).first() if int(against) > 0 else None
        if before is None and int(against) > 0:
            raise ApplicationError(f"Agent {agent.name!r} has no version {against}.", status_code=404)
        changes = config_diff(before.config if before else {}, after.config)
        return Response({"from": before.number if before else None, "to": after.number, "changes": changes})

    @extend_schema(request=PublishInputSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def publish(self, request: Request, pk: str | None = None) -> Response:
        """``POST …/publish/ {version?, note?}``: publish a version (default: the draft)."""
        agent = self.get_object()
        data = PublishInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._publish(agent, data.validated_data.get("version"), data.validated_data["note"], "publish")

    @extend_schema(request=RollbackInputSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, pk: str | None = None) -> Response:
        """``POST …/rollback/ {version}``: publish an earlier version again."""
        agent = self.get_object()
        data = RollbackInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._publish(agent, data.validated_data["version"], "", "rollback")

    def _publish(self, agent: AgentInstance, number: int | None, note: str, what: str) -> Response:
        try:
            version = version_publish(agent, number=number, user=self.request.user, note=note)
        except VersionError as exc:
            raise ApplicationError(str(exc), status_code=404) from exc
        audit_record(action=Action.UPDATE, obj=agent, changes={"published_version": {"to": version.number}},
                     detail={"action": what})
        return Response(_version_state(agent))


class BindingSerializer(serializers.ModelSerializer):
    agent = TenantPrimaryKeyRelatedField(AgentInstance)
    mcp_server = TenantPrimaryKeyRelatedField(McpServer, required=False, allow_null=True)
    cli_command = TenantPrimaryKeyRelatedField(CliCommand, required=False, allow_null=True)
    skill = TenantPrimaryKeyRelatedField(Skill, required=False, allow_null=True)
    allowed_tools = serializers.ListField(child=serializers.CharField(), required=False)

    class Meta:
        model = CapabilityBinding
        # ``kind``: a registered capability kind (the model field's choices follow
        # capabilities.registry); the columns any kind may use (CapabilityKind.fields), validated
        # by CapabilityBinding.clean through the kind.
        fields = ["id", "agent", "kind", *BINDING_FIELDS, "enabled", "created_at"]


class BindingViewSet(TenantScopedViewSet):
    """Capability bindings: which MCP servers, built-in tools, CLI commands and skills an agent may use."""

    model = CapabilityBinding
    serializer_class = BindingSerializer

    def perform_create(self, serializer):
        with versions_batch(user=self.request.user):
            serializer.instance = binding_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer):
        with versions_batch(user=self.request.user):
            serializer.instance = binding_save(
                tenant=self.request.tenant, binding=serializer.instance, **serializer.validated_data
            )
