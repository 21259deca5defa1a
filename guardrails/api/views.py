"""The guardrails admin API (``/api/v1/admin/guardrails/``): tenant owners and admins list,
create, change and delete their agents' guardrails. docs/api.md, docs/admin-guide.md "Guardrails"."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from rest_framework import serializers

from guardrails.api.serializers import GuardrailSerializer
from guardrails.models import Guardrail
from guardrails.services import guardrail_save
from tenants.api.mixins import TenantScopedViewSet


class GuardrailViewSet(TenantScopedViewSet):
    """Guardrails of the tenant's agents, ordered by agent, point and position; ``?agent=<id>``
    filters by agent. Each write records a new version of the agent."""

    model = Guardrail
    serializer_class = GuardrailSerializer

    def get_queryset(self) -> models.QuerySet:
        queryset = super().get_queryset().order_by("agent_id", "point", "position", "id")
        agent = self.request.query_params.get("agent") if not getattr(self, "swagger_fake_view", False) else None
        if agent is not None:
            queryset = queryset.filter(agent_id=int(agent) if agent.isdigit() else -1)
        return queryset

    def _save(self, serializer: serializers.BaseSerializer, guardrail: Guardrail | None) -> None:
        try:
            serializer.instance = guardrail_save(tenant=self.request.tenant, guardrail=guardrail,  # type: ignore[attr-defined]
                                                 **serializer.validated_data)
        except ValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from exc

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        self._save(serializer, None)

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        self._save(serializer, serializer.instance)
