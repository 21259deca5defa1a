"""``GET /api/v1/sessions/<id>/events``: a session's events as Server-Sent Events.

The same frames as the WebSocket (`sessions.consumers`), one per SSE message with
``id: <seq>`` and ``event: <type>``. A client that reconnects sends ``Last-Event-ID`` (browsers'
EventSource does it by itself) or ``?after_seq=N`` and gets everything after it from the
replay stream, then live events; a ``: ping`` comment every 15 s keeps proxies from closing
the connection. Authentication: ``Authorization: Bearer <token>`` or the session cookie;
another tenant's session, or another user's, answers 404 like a missing one.

A plain async Django view (DRF views are synchronous): it streams without holding a thread.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from channels.db import database_sync_to_async
from django.contrib.auth import get_user
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from sessions.events import events_follow
from tenants.scoping import tenant_scope
from tenants.selectors import api_token_authenticate, membership_for_user

PING_SECONDS = 15.0


@database_sync_to_async
def _authorize(request: HttpRequest, session_id: int) -> tuple[int, str] | None:
    """(status, message) when refused, else None."""
    from sessions.selectors import chat_session_get_for_user

    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        token = api_token_authenticate(raw=header.split(None, 1)[1].strip())
        if token is None:
            return 401, "Invalid or revoked token."
        user, membership = token.membership.user, token.membership
    else:
        user = get_user(request)
        membership = membership_for_user(user=user, tenant_slug=request.headers.get("X-Tenant"))
        if not user.is_authenticated:
            return 401, "Authentication credentials were not provided."
        if membership is None:
            return 403, "You are not a member of any tenant."
    with tenant_scope(membership.tenant_id):
        if chat_session_get_for_user(session_id=session_id, user_id=user.pk) is None:
            return 404, "Session not found."
    return None


def _after_seq(request: HttpRequest) -> int:
    raw = request.headers.get("Last-Event-ID") or request.GET.get("after_seq") or "0"
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


def _message(frame: dict[str, Any]) -> str:
    return f"id: {frame['seq']}\nevent: {frame['type']}\ndata: {json.dumps(frame)}\n\n"


async def session_events_sse(request: HttpRequest, session_id: int) -> HttpResponse:
    if request.method != "GET":
        return JsonResponse({"message": "Method not allowed.", "extra": {}}, status=405)
    refused = await _authorize(request, session_id)
    if refused is not None:
        status, message = refused
        return JsonResponse({"message": message, "extra": {}}, status=status)

    async def stream() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        async for frame in events_follow(session_id=session_id, after_seq=_after_seq(request),
                                         block_seconds=PING_SECONDS):
            yield ": ping\n\n" if frame is None else _message(frame)

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response
