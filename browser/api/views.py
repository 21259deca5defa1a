"""Browser pairing and device endpoints.

- ``POST pairings/`` (no auth; ``BROWSER_PAIRING_RATE_LIMIT`` per client IP per minute, so a
  flood from one address blocks that address for at most a minute) → ``{pairing_id, code,
  poll_secret, expires_at}``: the extension shows ``code``.
- ``POST pairings/approve/ {code}`` (logged-in user) → binds the pairing to the user and the
  request's tenant. Wrong codes are limited per user (10 minutes); a user's mistakes never
  block another user.
- ``POST pairings/<id>/token/ {poll_secret}`` (no auth) → ``{status: "pending"}`` or, once,
  ``{status: "approved", token, device}``. Polls are limited per pairing (by its secret);
  failed polls (unknown pairing, wrong secret) per client IP, which never blocks the right
  secret's polls.

Rate-limited answers are 429 with ``Retry-After``.
- ``GET devices/`` / ``GET devices/<id>/`` / ``DELETE devices/<id>/`` (the caller's own
  devices in the tenant; DELETE revokes).
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_platform.api_errors import NotFound
from agent_platform.api_schema import StrictCharField
from browser import selectors, services
from browser.models import BrowserDevice
from tenants.api.mixins import TenantScopedApiView
from tenants.audit import audit_context, context_for_request


def _client_ip(request: Request) -> str:
    return request.META.get("REMOTE_ADDR", "") or "unknown"


class DeviceOutputSerializer(serializers.ModelSerializer):
    connected = serializers.SerializerMethodField()

    class Meta:
        model = BrowserDevice
        fields = ["id", "name", "token_prefix", "extension_version", "created_at", "last_seen_at", "revoked_at",
                  "connected"]

    def get_connected(self, device: BrowserDevice) -> bool:
        return device.pk in self.context.get("connected_ids", set())


class BrowserPairingCreateApi(APIView):
    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PairingCreateInput"

        name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")

    @extend_schema(request=InputSerializer, responses={201: inline_serializer("PairingCreated", {
        "pairing_id": serializers.IntegerField(), "code": serializers.CharField(),
        "poll_secret": serializers.CharField(), "expires_at": serializers.DateTimeField(),
        "poll_interval_seconds": serializers.IntegerField()})})
    def post(self, request: Request) -> Response:
        services.rate_limit_hit(key=f"pair:{_client_ip(request)}", limit=settings.BROWSER_PAIRING_RATE_LIMIT,
                                window_seconds=60)
        data = self.InputSerializer(data=request.data or {})
        data.is_valid(raise_exception=True)
        issued = services.browser_pairing_create(name=data.validated_data["name"])
        return Response({
            "pairing_id": issued.pairing.pk, "code": issued.code, "poll_secret": issued.poll_secret,
            "expires_at": issued.pairing.expires_at, "poll_interval_seconds": 2,
        }, status=status.HTTP_201_CREATED)


class BrowserPairingTokenApi(APIView):
    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PairingTokenInput"

        poll_secret = StrictCharField(max_length=200)

    @extend_schema(request=InputSerializer, responses={200: inline_serializer("PairingClaim", {
        "status": serializers.ChoiceField(choices=["pending", "approved"]),
        "token": serializers.CharField(required=False),
        "device": serializers.DictField(required=False), "user": serializers.DictField(required=False),
        "tenant": serializers.DictField(required=False)})})
    def post(self, request: Request, pairing_id: int) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        secret = data.validated_data["poll_secret"]
        # Each pairing's own polls (keyed by its secret, which only its extension knows) ...
        services.rate_limit_hit(key=f"poll:{pairing_id}:{services.sha256_hex(secret)[:32]}",
                                limit=settings.BROWSER_PAIRING_POLL_RATE_LIMIT, window_seconds=600)
        try:
            with audit_context(context_for_request(request, source="api")):
                result = services.browser_pairing_claim(pairing_id=pairing_id, poll_secret=secret)
        except NotFound:
            # ... and failures per address: a client guessing at pairings is stopped without
            # blocking the right secret's polls from the same address.
            services.rate_limit_hit(key=f"pollfail:{_client_ip(request)}",
                                    limit=settings.BROWSER_PAIRING_POLL_FAILURE_LIMIT, window_seconds=600)
            raise
        if result.status == "pending":
            return Response({"status": "pending"})
        return Response({
            "status": "approved", "token": result.token,
            "device": {"id": result.device.pk, "name": result.device.name},
            "user": {"username": result.device.user.get_username()},
            "tenant": {"slug": result.device.tenant.slug, "name": result.device.tenant.name},
        })


class BrowserPairingApproveApi(TenantScopedApiView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PairingApproveInput"

        code = StrictCharField(max_length=20)

    @extend_schema(request=InputSerializer, responses={200: inline_serializer("PairingApproved", {
        "pairing_id": serializers.IntegerField(), "approved": serializers.BooleanField(),
        "name": serializers.CharField()})})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # Wrong codes (guesses) are limited per user: one user's mistakes never block another
        # user, and a right code is not counted.
        key, limit = f"approvefail:{request.user.pk}", settings.BROWSER_PAIRING_APPROVE_RATE_LIMIT
        services.rate_limit_check(key=key, limit=limit, window_seconds=600)
        try:
            pairing = services.browser_pairing_approve(code=data.validated_data["code"], user=request.user,
                                                       tenant=request.tenant)
        except NotFound:
            services.rate_limit_hit(key=key, limit=limit, window_seconds=600)
            raise
        return Response({"pairing_id": pairing.pk, "approved": True, "name": pairing.name})


class BrowserDeviceListApi(TenantScopedApiView):
    """The caller's paired browser devices in this tenant, newest first, revoked ones included:
    ``{results: [device]}`` (not paginated), each with ``connected`` (it has a live socket now)."""

    @extend_schema(operation_id="v1_browser_devices_list", responses={200: inline_serializer("DeviceList", {
        "results": serializers.ListField(child=DeviceOutputSerializer())})})
    def get(self, request: Request) -> Response:
        from browser.bridge import connected_device_ids_sync

        devices = list(selectors.browser_device_list(user_id=request.user.pk))
        connected = connected_device_ids_sync(tenant_id=request.tenant.pk, user_id=request.user.pk)
        return Response({"results": DeviceOutputSerializer(devices, many=True, context={"connected_ids": connected}).data})


class BrowserDeviceDetailApi(TenantScopedApiView):
    def _get(self, request: Request, device_id: int) -> BrowserDevice:
        device = selectors.browser_device_get(user_id=request.user.pk, device_id=device_id)
        if device is None:
            raise NotFound("Device not found.")
        return device

    @extend_schema(responses={200: DeviceOutputSerializer})
    def get(self, request: Request, device_id: int) -> Response:
        return Response(DeviceOutputSerializer(self._get(request, device_id)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, device_id: int) -> Response:
        services.browser_device_revoke(device=self._get(request, device_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
