"""Tenant-admin CRUD for model providers and routes."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from llm.models import ModelProvider, ModelRoute, ModelRouteEntry
from llm.services import provider_save, route_health, route_save, route_test
from tenants.api.mixins import TenantPrimaryKeyRelatedField, TenantScopedViewSet


class ProviderSerializer(serializers.ModelSerializer):
    api_key = serializers.CharField(write_only=True, required=False, allow_blank=True, style={"input_type": "password"})
    has_api_key = serializers.BooleanField(read_only=True)

    class Meta:
        model = ModelProvider
        fields = ["id", "name", "api", "base_url", "api_key", "has_api_key", "created_at"]


class ProviderViewSet(TenantScopedViewSet):
    """Model providers (OpenAI-compatible endpoints). The API key is write-only."""

    model = ModelProvider
    serializer_class = ProviderSerializer

    def perform_create(self, serializer: ProviderSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = provider_save(tenant=self.request.tenant, api_key=data.pop("api_key", None), **data)

    def perform_update(self, serializer: ProviderSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = provider_save(
            tenant=self.request.tenant, provider=serializer.instance, api_key=data.pop("api_key", None), **data
        )


class RouteEntrySerializer(serializers.ModelSerializer):
    provider = TenantPrimaryKeyRelatedField(ModelProvider)

    class Meta:
        model = ModelRouteEntry
        fields = [
            "id", "position", "provider", "model", "max_input_tokens", "max_output_tokens", "tool_calls",
            "temperature", "supports_tools", "supports_images", "json_schema_mode", "max_retries", "connect_timeout_seconds",
            "first_token_timeout_seconds", "read_timeout_seconds", "stream_timeout_seconds", "input_price_per_mtok",
            "output_price_per_mtok",
        ]
        read_only_fields = ["id", "position"]


class RouteSerializer(serializers.ModelSerializer):
    entries = RouteEntrySerializer(many=True, required=False)

    class Meta:
        model = ModelRoute
        fields = ["id", "name", "description", "entries", "created_at"]


_PROBE = inline_serializer("RouteEntryProbe", many=True, fields={
    "entry_id": serializers.IntegerField(), "position": serializers.IntegerField(),
    "provider": serializers.CharField(), "model": serializers.CharField(), "ok": serializers.BooleanField(),
    "latency_ms": serializers.IntegerField(), "error_class": serializers.CharField(allow_null=True),
    "error": serializers.CharField(), "reply": serializers.CharField(),
})
_HEALTH = inline_serializer("RouteEntryHealth", many=True, fields={
    "entry_id": serializers.IntegerField(), "position": serializers.IntegerField(),
    "provider": serializers.CharField(), "model": serializers.CharField(), "state": serializers.CharField(),
    "cooldown_until": serializers.DateTimeField(allow_null=True), "calls_last_minute": serializers.IntegerField(),
    "failures_last_minute": serializers.IntegerField(), "last_error_class": serializers.CharField(allow_null=True),
})


class RouteViewSet(TenantScopedViewSet):
    """Model routes: ordered entries; the first that answers wins. PUT/PATCH with
    ``entries`` replaces them all, in the order given."""

    model = ModelRoute
    serializer_class = RouteSerializer

    def get_queryset(self):
        return super().get_queryset().prefetch_related("entries")

    def perform_create(self, serializer: RouteSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = route_save(tenant=self.request.tenant, entries=data.pop("entries", []), **data)

    def perform_update(self, serializer: RouteSerializer) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = route_save(
            tenant=self.request.tenant, route=serializer.instance, entries=data.pop("entries", None), **data
        )

    @extend_schema(request=None, responses={200: _PROBE})
    @action(detail=True, methods=["post"], pagination_class=None)
    def test(self, request: Request, pk: str | None = None) -> Response:
        """Send a tiny request through each entry on its own; report latency or the error class."""
        return Response(route_test(route=self.get_object()))

    @extend_schema(responses={200: _HEALTH})
    @action(detail=True, methods=["get"], pagination_class=None)
    def health(self, request: Request, pk: str | None = None) -> Response:
        """Each entry's cooldown state and last minute's error rate, shared by all workers."""
        return Response(route_health(route=self.get_object()))
