"""``GET /api/v1/runs/<id>/trace/``: a run's trace for the run's own user (the chat app's
"details" view on an answer)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import NotFound
from sessions.selectors import run_get_for_user
from sessions.trace_selectors import run_trace
from tenants.api.mixins import TenantScopedApiView


class RunTraceApi(TenantScopedApiView):
    """The timeline of one of the caller's runs, member-visible fields only.

    Shape: :func:`sessions.trace_selectors.run_trace` with ``admin=False`` (no prompts, system
    prompt, reasoning, provider names, provider error text, user names). Only the run's own user, as
    long as the chat is not deleted (:func:`sessions.selectors.run_get_for_user`): anyone
    else's run (an admin's too) or a run of a deleted chat answers 404 "Run not found.";
    admins read the full trace in the console.
    """

    @extend_schema(responses=inline_serializer("RunTrace", {
        "run": serializers.DictField(), "turns": serializers.ListField(child=serializers.DictField()),
        "totals": serializers.DictField(),
    }))
    def get(self, request: Request, run_id: int) -> Response:
        run = run_get_for_user(run_id=run_id, user_id=request.user.pk)  # not in a deleted chat
        if run is None or run.user_id != request.user.pk:
            raise NotFound("Run not found.")
        return Response(run_trace(run=run, admin=False))
