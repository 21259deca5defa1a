"""Agents: the list end users pick from, and tenant-admin CRUD for agents and bindings."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.request import Request

from agents.models import AgentInstance, CapabilityBinding
from agents.selectors import agent_list_active
from agents.services import agent_save, binding_save
from capabilities.models import CliCommand, McpServer, Skill
from capabilities.registry import BINDING_FIELDS
from llm.models import ModelRoute
from tenants.api.mixins import TenantContextMixin, TenantPrimaryKeyRelatedField, TenantScopedViewSet


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
            "max_cost_per_run_usd", "is_active", "a2a_public", "created_at", "updated_at",
        ]


class AgentViewSet(TenantScopedViewSet):
    model = AgentInstance
    serializer_class = AgentAdminSerializer

    def perform_create(self, serializer):
        serializer.instance = agent_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = agent_save(tenant=self.request.tenant, agent=serializer.instance, **serializer.validated_data)


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
        serializer.instance = binding_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer):
        serializer.instance = binding_save(
            tenant=self.request.tenant, binding=serializer.instance, **serializer.validated_data
        )
