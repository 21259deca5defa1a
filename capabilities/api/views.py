"""Tenant-admin CRUD for MCP servers. ``env`` and ``headers`` are write-only (encrypted)."""

from __future__ import annotations

from rest_framework import serializers

from capabilities.models import McpServer
from capabilities.services import mcp_server_save
from tenants.api.mixins import TenantScopedViewSet


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
