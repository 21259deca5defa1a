"""Serializers of the guardrails admin API."""

from __future__ import annotations

from rest_framework import serializers

from guardrails.models import Guardrail
from tenants.api.mixins import TenantPrimaryKeyRelatedField


class GuardrailSerializer(serializers.ModelSerializer):
    """A guardrail: ``agent`` and ``route`` (model checks) are the tenant's ids; ``config`` by kind
    (docs/admin-guide.md, "Guardrails")."""

    agent = TenantPrimaryKeyRelatedField(Guardrail.agent.field.related_model)
    route = TenantPrimaryKeyRelatedField(Guardrail.route.field.related_model, required=False, allow_null=True)
    config = serializers.JSONField(required=False)

    class Meta:
        model = Guardrail
        fields = ["id", "agent", "name", "point", "kind", "position", "enabled", "action", "on_error", "config",
                  "message", "route", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        validators: list = []  # the (agent, name) uniqueness is checked by the model's full_clean
