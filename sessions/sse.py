"""``GET /api/v1/sessions/<id>/events``: a session's events as Server-Sent Events.

The same frames as the WebSocket (`sessions.consumers`), one per SSE message with
``id: <seq>`` and ``event: <type>``. A client that reconnects sends ``Last-Event-ID`` (browsers'
EventSource does it by itself) or ``?after_seq=N`` and gets everything after it from the
replay stream, then live events; a ``: ping`` comment every
:data:`sessions.event_reader.PING_SECONDS` keeps
proxies from closing the connection, and an idle stream never times out. Authentication:
``Authorization: Bearer <token>`` or the session cookie; another tenant's session, or another
user's, answers 404 like a missing one.

What is sent comes from :class:`sessions.event_reader.SessionEventReader`, as for the
WebSocket (replay, gaps filled from the stream, pings, the end); this view only encodes it.
Live events come from the web process's one Redis subscription (:mod:`sessions.live`): an
open stream holds no Redis connection of its own (it borrows a pooled one for a moment to
replay, to read a frame the pub/sub fan-out dropped, and to renew its slot; the look for
dropped frames every ``CATCH_UP_SECONDS`` is one ``MGET`` shared by the process's streams).

Guards (:mod:`sessions.stream_guard`): ``Last-Event-ID``/``after_seq`` must be an integer
in 0..2**63-1 (else 400); a user holds at most ``STREAMS_PER_USER_MAX`` streams (WebSocket
+ SSE; else 429 with ``Retry-After``); the credential is re-checked every
``AUTH_RECHECK_SECONDS`` (a token's revocation ends its streams at once,
:mod:`agent_platform.revocations`) and the process stopping ends the stream: both send
``event: stream_closed`` (data ``{"reason": "unauthenticated" | "server_stopping"}``) and
end the response. Every refusal is JSON ``{message, extra}``.

A plain async Django view (DRF views are synchronous): it streams without holding a thread.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Final

from channels.db import database_sync_to_async
from django.contrib.auth import get_user
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from agent_platform.shutdown import is_stopping
from sessions import stream_guard
from sessions.event_reader import Closed, Event, Item, SessionEventReader
from sessions.stream_guard import InvalidAfterSeq, StreamCredential
from tenants.resolution import caller_resolve
from tenants.scoping import tenant_scope

RETRY_AFTER_SECONDS: Final[int] = 15


@database_sync_to_async
def _authorize(request: HttpRequest, session_id: int) -> tuple[int, str] | StreamCredential:
    """The caller's credential, or (status, message) when refused."""
    from sessions.selectors import chat_session_visible_to_user

    header = request.headers.get("Authorization", "")
    bearer = header.lower().startswith("bearer ")
    parts = header.split(None, 1)
    raw = parts[1].strip() if bearer and len(parts) == 2 else ""
    if bearer and not raw:
        return 401, "Invalid or revoked token."
    caller = caller_resolve(user=None if raw else get_user(request), raw_token=raw,
                            tenant_slug=request.headers.get("X-Tenant") or request.GET.get("tenant"))
    if caller is None:
        return 401, "Invalid or revoked token." if raw else "Authentication credentials were not provided."
    user, membership = caller.user, caller.membership
    if membership is None:
        return 403, "You are not a member of any tenant."
    if caller.token is not None:
        credential = StreamCredential(user_id=user.pk, membership_id=membership.pk, token_id=caller.token.pk)
    else:
        credential = StreamCredential(user_id=user.pk, membership_id=membership.pk,
                                      session_key=request.session.session_key)
    with tenant_scope(membership.tenant_id):
        if not chat_session_visible_to_user(session_id=session_id, user_id=user.pk):
            return 404, "Session not found."
    return credential


async def session_events_sse(request: HttpRequest, session_id: int) -> HttpResponse:
    """The SSE response (see the module docstring), or a JSON ``{message, extra}`` refusal:
    405 not GET, 401/403 credentials, 404 no such session for the caller, 400 a bad
    ``Last-Event-ID``/``after_seq``, 429 too many open streams, 503 the server is stopping."""
    if request.method != "GET":
        return JsonResponse({"message": "Method not allowed.", "extra": {}}, status=405)
    credential = await _authorize(request, session_id)
    if not isinstance(credential, StreamCredential):
        status, message = credential
        return JsonResponse({"message": message, "extra": {}}, status=status)
    try:
        after_seq = stream_guard.parse_after_seq(request.headers.get("Last-Event-ID") or request.GET.get("after_seq"))
    except InvalidAfterSeq as exc:
        return JsonResponse({"message": str(exc), "extra": {"field": "after_seq"}}, status=400)
    if is_stopping():
        return JsonResponse({"message": "The server is stopping.", "extra": {}}, status=503)
    slot = await stream_guard.stream_slot_acquire(user_id=credential.user_id)
    if slot is None:
        limit = stream_guard.streams_per_user_max()
        response = JsonResponse({"message": f"Too many open event streams (at most {limit} per user).",
                                 "extra": {"max_streams": limit}}, status=429)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    reader = SessionEventReader(session_id=session_id, after_seq=after_seq, credential=credential, slot=slot)
    response = StreamingHttpResponse(_stream(reader), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


async def _stream(reader: SessionEventReader) -> AsyncIterator[str]:
    """The SSE text of ``reader``'s items (:mod:`sessions.event_reader`): ``retry`` first, then
    one message per event, a ``: ping`` comment per ping, ``stream_closed`` at the end. Closes
    the reader when it ends (also when cancelled: the client left)."""
    try:
        yield "retry: 1000\n\n"
        await reader.open()
        async for item in reader:
            yield _encoded(item)
    finally:
        await reader.close()


def _encoded(item: Item) -> str:
    if isinstance(item, Event):
        return f"id: {item.seq}\nevent: {item.type}\ndata: {item.text}\n\n"
    if isinstance(item, Closed):
        return f"event: stream_closed\ndata: {json.dumps({'reason': item.reason})}\n\n"
    return ": ping\n\n"
