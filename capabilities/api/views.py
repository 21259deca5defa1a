"""Tenant-admin CRUD for MCP servers (``env`` and ``headers`` are write-only, encrypted), remote
A2A agents (``headers`` write-only, encrypted) and skills."""

from __future__ import annotations

from rest_framework import permissions, serializers, viewsets

from capabilities.a2a.models import A2aAgent
from capabilities.a2a.services import a2a_agent_save
from capabilities.catalogue import ProgramTemplate, TemplateKind
from capabilities.models import McpServer, Skill
from capabilities.services import mcp_server_save
from capabilities.skills.services import skill_save
from llm.models import ModelRoute
from tenants.api.mixins import IsTenantAdmin, TenantContextMixin, TenantPrimaryKeyRelatedField, TenantScopedViewSet


class ProgramTemplateSerializer(serializers.ModelSerializer):
    """A template of the operator catalogue, as tenant admins see it (read-only)."""

    class Meta:
        model = ProgramTemplate
        fields = [
            "id", "slug", "name", "description", "kind", "argv", "tenant_parameters", "secrets", "network",
            "parameters_schema", "timeout_seconds", "max_output_bytes", "limits",
        ]
        read_only_fields = fields


class ProgramTemplateViewSet(TenantContextMixin, viewsets.ReadOnlyModelViewSet):
    """``GET /api/v1/admin/program-templates/``: the templates the caller's tenant may enable
    (owners and admins). Only platform operators write them (console, ``catalogue_import``)."""

    serializer_class = ProgramTemplateSerializer
    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]
    lookup_field = "slug"

    def get_queryset(self):
        from django.db.models import Q

        if getattr(self, "swagger_fake_view", False):
            return ProgramTemplate.objects.none()
        tenant = self.request.tenant
        return ProgramTemplate.objects.filter(enabled=True).filter(
            Q(tenants__isnull=True) | Q(tenants=tenant)).distinct().order_by("name")


class _TemplateField(serializers.SlugRelatedField):
    """A template by slug, among the enabled templates of ``kind`` the tenant may use."""

    def __init__(self, kind: str, **kwargs):
        self.kind = kind
        super().__init__(slug_field="slug", **kwargs)

    def get_queryset(self):
        from django.db.models import Q

        tenant = getattr(self.context.get("request"), "tenant", None)
        if tenant is None:
            return ProgramTemplate.objects.none()
        return ProgramTemplate.objects.filter(kind=self.kind, enabled=True).filter(
            Q(tenants__isnull=True) | Q(tenants=tenant)).distinct()


class McpServerSerializer(serializers.ModelSerializer):
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True), write_only=True, required=False,
        help_text="stdio: the template's secrets (write-only, stored encrypted).",
    )
    headers = serializers.DictField(child=serializers.CharField(allow_blank=True), write_only=True, required=False)
    template = _TemplateField(
        TemplateKind.MCP_STDIO, required=False, allow_null=True,
        help_text="stdio: the slug of a program template (GET /api/v1/admin/program-templates/).",
    )
    parameters = serializers.DictField(
        child=serializers.CharField(allow_blank=True), required=False,
        help_text="stdio: values of the template's tenant parameters.",
    )
    oauth_client_secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True,
        help_text="OAuth: the secret of the admin-entered client (write-only, stored encrypted; omit to keep).",
    )
    oauth_private_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=20_000, trim_whitespace=False,
        help_text="OAuth client credentials: the client's PEM private key for private_key_jwt (RFC 7523; "
                  "write-only, stored encrypted; omit to keep).",
    )

    class Meta:
        model = McpServer
        fields = [
            "id", "name", "alias", "transport", "template", "parameters", "env", "url", "headers",
            "auth_mode", "oauth_client_id", "oauth_client_secret", "oauth_private_key", "oauth_scope",
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
            tenant=self.request.tenant, env=data.pop("env", None), headers=data.pop("headers", None),
            oauth_client_secret=data.pop("oauth_client_secret", None),
            oauth_private_key=data.pop("oauth_private_key", None), **data
        )

    def perform_update(self, serializer: McpServerSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = mcp_server_save(
            tenant=self.request.tenant, server=serializer.instance,
            env=data.pop("env", None), headers=data.pop("headers", None),
            oauth_client_secret=data.pop("oauth_client_secret", None),
            oauth_private_key=data.pop("oauth_private_key", None), **data,
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


class A2aAgentSerializer(serializers.ModelSerializer):
    headers = serializers.DictField(
        child=serializers.CharField(allow_blank=True), write_only=True, required=False,
        help_text="Sent with the card's request and every call, e.g. {\"Authorization\": \"Bearer …\"} "
                  "(write-only, stored encrypted; omit to keep, {} to remove).",
    )
    has_headers = serializers.SerializerMethodField()

    class Meta:
        model = A2aAgent
        fields = ["id", "name", "card_url", "headers", "has_headers", "call_timeout_seconds", "enabled", "created_at",
                  "card_snapshot", "last_error"]
        read_only_fields = ["card_snapshot", "last_error"]

    def get_has_headers(self, agent: A2aAgent) -> bool:
        return bool(agent.headers_encrypted)


class A2aAgentViewSet(TenantScopedViewSet):
    """``/api/v1/admin/a2a-agents/``: remote A2A agents, bound to our agents with the ``a2a`` kind."""

    model = A2aAgent
    serializer_class = A2aAgentSerializer

    def perform_create(self, serializer: A2aAgentSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = a2a_agent_save(tenant=self.request.tenant, headers=data.pop("headers", None), **data)

    def perform_update(self, serializer: A2aAgentSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = a2a_agent_save(tenant=self.request.tenant, agent=serializer.instance,
                                             headers=data.pop("headers", None), **data)
