"""``/api/v1/admin/commands/``: tenant admins' slash commands (CRUD). What a chat lists is
``GET /api/v1/agents/<id>/commands/`` (:mod:`agents.api.commands`)."""

from __future__ import annotations

from rest_framework import serializers

from capabilities.commands.models import Command
from capabilities.commands.services import command_save
from tenants.api.mixins import TenantScopedViewSet


class CommandArgumentSerializer(serializers.Serializer):
    """A named argument of a command."""

    name = serializers.CharField(max_length=64, help_text="Written $name or ${name} in the template.")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    required = serializers.BooleanField(required=False, default=False)


class CommandSerializer(serializers.ModelSerializer):
    arguments = CommandArgumentSerializer(many=True, required=False)

    class Meta:
        model = Command
        fields = ["id", "name", "description", "template", "arguments", "created_at", "updated_at"]


class CommandViewSet(TenantScopedViewSet):
    """Slash commands (tenant admins): a name, a description, a Markdown template with
    ``$ARGUMENTS`` and ``$name`` placeholders and its named arguments. Bind one to an agent
    with ``POST /api/v1/admin/bindings/ {"agent": …, "kind": "command", "config": {"command": <id>}}``."""

    model = Command
    serializer_class = CommandSerializer

    def perform_create(self, serializer: CommandSerializer) -> None:
        serializer.instance = command_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer: CommandSerializer) -> None:
        serializer.instance = command_save(tenant=self.request.tenant, command=serializer.instance,
                                           **serializer.validated_data)
