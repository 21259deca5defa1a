"""``GET /api/v1/runs/<id>/trace/``: a run's trace for the run's own user (the chat app's
"details" view on an answer)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import NotFound
from console.trace import run_trace
from sessions.models import Run
from tenants.api.mixins import TenantScopedApiView


class RunTraceApi(TenantScopedApiView):
    """The timeline of one of the caller's runs, member-visible fields only.

    Shape: :func:`console.trace.run_trace` with ``admin=False`` (no prompts, system prompt,
    reasoning, provider names, provider error text, user names). Only the run's own user:
    anyone else's run (an admin's too) answers 404 "Run not found."; admins read the full
    trace in the console.
    """

    @extend_schema(responses=inline_serializer("RunTrace", {
        "run": serializers.DictField(), "turns": serializers.ListField(child=serializers.DictField()),
        "totals": serializers.DictField(),
    }))
    def get(self, request: Request, run_id: int) -> Response:
        run = (
            Run.objects.select_related("session__agent", "user")
            .filter(pk=run_id, user_id=request.user.pk, session__user_id=request.user.pk).first()
        )
        if run is None:
            raise NotFound("Run not found.")
        return Response(run_trace(run=run, admin=False))
