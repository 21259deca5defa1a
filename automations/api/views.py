"""The schedules and webhook-triggers API (``/api/v1/schedules/``, ``/api/v1/webhook-triggers/``):
members manage their own, for the tenant's active agents; tenant owners and admins manage all
of the tenant's. docs/api.md and docs/admin-guide.md, "Schedules and webhooks"."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from automations.api.serializers import (
    ScheduleSerializer,
    ScheduleSlotSerializer,
    SubscriptionSecretSerializer,
    TriggerSecretSerializer,
    WebhookDeliverySerializer,
    WebhookSubscriptionSerializer,
    WebhookTriggerSerializer,
)
from automations.models import Schedule, WebhookDelivery, WebhookSubscription, WebhookTrigger
from automations.outbound import delivery_redeliver, subscription_create, subscription_update
from automations.services import schedule_save, template_check, trigger_create, trigger_rotate_secret
from tenants.api.mixins import IsTenantAdmin, TenantContextMixin, TenantScopedViewSet


class _OwnOrAdminViewSet(TenantScopedViewSet):
    """Members see and change the rows they own; admins every row of the tenant."""

    permission_classes = [permissions.IsAuthenticated]
    throttle_scopes = ("runs",)

    def get_queryset(self) -> models.QuerySet:
        queryset = super().get_queryset()
        if getattr(self, "swagger_fake_view", False):
            return queryset
        if not self.request.membership.is_admin:  # type: ignore[attr-defined]
            queryset = queryset.filter(owner_id=self.request.user.pk)
        return queryset.select_related("agent").order_by("pk")


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("agent", int, description="Only this agent's schedules."),
            OpenApiParameter("mine", bool, description="true: only the caller's own (an admin sees everyone's)."),
        ]
    )
)
class ScheduleViewSet(_OwnOrAdminViewSet):
    """Schedules: CRUD (the list filtered by ``?agent=<id>`` and ``?mine=true``: the chat
    app's "Scheduled" on an agent), and ``slots/`` (the slots that fired, newest first, with
    their run or the reason the start failed)."""

    model = Schedule
    serializer_class = ScheduleSerializer

    def get_queryset(self) -> models.QuerySet:
        queryset = super().get_queryset()
        if self.action != "list":
            return queryset
        agent = self.request.query_params.get("agent", "")
        if agent:
            if not agent.isdigit():
                raise serializers.ValidationError({"agent": ["An agent's id (a whole number)."]})
            queryset = queryset.filter(agent_id=int(agent))
        if self.request.query_params.get("mine", "").lower() in ("1", "true"):
            queryset = queryset.filter(owner_id=self.request.user.pk)
        return queryset

    def _save(self, serializer: serializers.BaseSerializer, schedule: Schedule | None) -> None:
        data: dict[str, Any] = dict(serializer.validated_data)
        current = (
            {}
            if schedule is None
            else {
                "agent": schedule.agent,
                "cron": schedule.cron,
                "timezone": schedule.timezone,
                "message": schedule.message,
                "name": schedule.name,
                "chat_mode": schedule.chat_mode,
                "chat": schedule.chat,
                "missed_policy": schedule.missed_policy,
                "paused": schedule.paused,
            }
        )
        merged = {**current, **data}
        owner = schedule.owner if schedule is not None else self.request.user
        serializer.instance = schedule_save(
            tenant=self.request.tenant,
            owner=owner,
            schedule=schedule,  # type: ignore[attr-defined]
            agent=merged["agent"],
            cron=merged["cron"],
            timezone_name=merged.get("timezone", "UTC"),
            message=merged["message"],
            name=merged.get("name", ""),
            chat_mode=merged.get("chat_mode", "new"),
            chat=merged.get("chat"),
            missed_policy=merged.get("missed_policy", "skip"),
            paused=merged.get("paused", False),
        )

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        self._save(serializer, None)

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        self._save(serializer, serializer.instance)

    @extend_schema(responses={200: ScheduleSlotSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def slots(self, request: Request, pk: str | None = None) -> Response:
        schedule = self.get_object()
        rows = schedule.slots.order_by("-slot_time")[:100]
        return Response(ScheduleSlotSerializer(rows, many=True).data)


class WebhookTriggerViewSet(_OwnOrAdminViewSet):
    """Inbound webhook triggers: CRUD (the secret is in the create answer only) and
    ``rotate-secret/`` (a new secret, shown once; the old one stops working)."""

    model = WebhookTrigger
    serializer_class = WebhookTriggerSerializer

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return TriggerSecretSerializer if self.action in {"create", "rotate_secret"} else WebhookTriggerSerializer

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        trigger, secret = trigger_create(
            tenant=self.request.tenant,
            owner=self.request.user,
            agent=data["agent"],  # type: ignore[attr-defined]
            name=data.get("name", ""),
            template=data.get("template"),
        )
        trigger.secret = secret  # type: ignore[attr-defined]
        serializer.instance = trigger

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        template = serializer.validated_data.get("template")
        if template is not None:
            template_check(template)
        agent = serializer.validated_data.get("agent")
        if agent is not None and not agent.is_active:
            from agent_platform.api_errors import ApplicationError

            raise ApplicationError("No such active agent in this tenant.")
        serializer.save()

    @extend_schema(request=None, responses={200: TriggerSecretSerializer})
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str | None = None) -> Response:
        trigger = self.get_object()
        with transaction.atomic():
            trigger.secret = trigger_rotate_secret(trigger=trigger)  # type: ignore[attr-defined]
        return Response(TriggerSecretSerializer(trigger).data, status=status.HTTP_200_OK)


class WebhookSubscriptionViewSet(TenantScopedViewSet):
    """Outbound webhook subscriptions of the tenant (owners and admins): CRUD; the secret is in
    the create answer only. ``deliveries/``: the subscription's delivery log."""

    model = WebhookSubscription

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return SubscriptionSecretSerializer if self.action == "create" else WebhookSubscriptionSerializer

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        data = serializer.validated_data
        subscription, secret = subscription_create(
            tenant=self.request.tenant,
            url=data["url"],
            event_types=data["event_types"],  # type: ignore[attr-defined]
            description=data.get("description", ""),
        )
        subscription.secret = secret  # type: ignore[attr-defined]
        serializer.instance = subscription

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = subscription_update(subscription=serializer.instance, **serializer.validated_data)

    @extend_schema(responses={200: WebhookDeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        subscription = self.get_object()
        rows = subscription.deliveries.prefetch_related("attempt_log").order_by("-created_at", "-id")[:100]
        return Response(WebhookDeliverySerializer(rows, many=True).data)


class WebhookDeliveryViewSet(TenantContextMixin, viewsets.ReadOnlyModelViewSet):
    """The tenant's outbound deliveries of its subscriptions (owners and admins), newest first;
    ``redeliver/`` queues one more attempt. A2A push notifications (deliveries of a member's own
    task) are not listed here: they carry that member's conversation."""

    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]
    serializer_class = WebhookDeliverySerializer

    def get_queryset(self) -> models.QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return WebhookDelivery.all_tenants.none()
        return (WebhookDelivery.objects.filter(subscription__isnull=False).prefetch_related("attempt_log")
                .order_by("-created_at", "-id"))

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def redeliver(self, request: Request, pk: str | None = None) -> Response:
        delivery = delivery_redeliver(delivery=self.get_object())
        return Response(WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)
