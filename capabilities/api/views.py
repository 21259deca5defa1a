"""Tenant-admin CRUD for MCP servers (``env`` and ``headers`` are write-only, encrypted) and skills."""

from __future__ import annotations

from rest_framework import serializers

from capabilities.models import McpServer, Skill
from capabilities.services import mcp_server_save
from capabilities.skills.services import skill_save
from llm.models import ModelRoute
from tenants.api.mixins import TenantPrimaryKeyRelatedField, TenantScopedViewSet


class McpServerSerializer(serializers.ModelSerializer):
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), write_only=True, required=False)
    headers = serializers.DictField(child=serializers.CharField(allow_blank=True), write_only=True, required=False)
    args = serializers.ListField(child=serializers.CharField(allow_blank=True), required=False)

    class Meta:
        model = McpServer
        fields = [
            "id", "name", "alias", "transport", "command", "args", "env", "url", "headers",
            "connect_timeout_seconds", "list_timeout_seconds", "call_timeout_seconds", "enabled", "created_at",
            "tools_snapshot", "tools_snapshot_at", "last_error",
        ]
        read_only_fields = ["tools_snapshot", "tools_snapshot_at", "last_error"]


class McpServerViewSet(TenantScopedViewSet):
    model = McpServer
    serializer_class = McpServerSerializer

    def perform_create(self, serializer: McpServerSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = mcp_server_save(
            tenant=self.request.tenant, env=data.pop("env", None), headers=data.pop("headers", None), **data
        )

    def perform_update(self, serializer: McpServerSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = mcp_server_save(
            tenant=self.request.tenant, server=serializer.instance,
            env=data.pop("env", None), headers=data.pop("headers", None), **data,
        )


class SkillSerializer(serializers.ModelSerializer):
    model_route = TenantPrimaryKeyRelatedField(ModelRoute, required=False, allow_null=True)
    allowed_tools = serializers.ListField(child=serializers.CharField(), required=False)
    skill_md = serializers.CharField(
        write_only=True, required=False, trim_whitespace=False,
        help_text="A whole SKILL.md; when given it replaces every other field.",
    )

    class Meta:
        model = Skill
        fields = [
            "id", "name", "description", "instructions", "allowed_tools", "model_route", "max_loop_count",
            "skill_md", "source", "created_at", "updated_at",
        ]
        read_only_fields = ["source"]
        extra_kwargs = {"name": {"required": False}, "description": {"required": False},
                        "instructions": {"required": False}}


class SkillViewSet(TenantScopedViewSet):
    """Skills (tenant admins): fields, or ``skill_md`` with a whole SKILL.md (see README "Skills")."""

    model = Skill
    serializer_class = SkillSerializer

    def perform_create(self, serializer: SkillSerializer) -> None:
        serializer.instance = skill_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer: SkillSerializer) -> None:
        serializer.instance = skill_save(tenant=self.request.tenant, skill=serializer.instance,
                                         **serializer.validated_data)
