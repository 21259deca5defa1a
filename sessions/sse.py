"""``GET /api/v1/sessions/<id>/events``: a session's events as Server-Sent Events.

The same frames as the WebSocket (`sessions.consumers`), one per SSE message with
``id: <seq>`` and ``event: <type>``. A client that reconnects sends ``Last-Event-ID`` (browsers'
EventSource does it by itself) or ``?after_seq=N`` and gets everything after it from the
replay stream, then live events; a ``: ping`` comment every :data:`PING_SECONDS` keeps
proxies from closing the connection, and an idle stream never times out. Authentication:
``Authorization: Bearer <token>`` or the session cookie; another tenant's session, or another
user's, answers 404 like a missing one.

Live events come from the web process's one Redis subscription (:mod:`sessions.live`), as
for the WebSocket: an open stream holds no Redis connection of its own (it borrows a pooled
one for a moment to replay, to read the stream every :data:`CATCH_UP_SECONDS` for a frame
the pub/sub fan-out may have dropped, and to renew its slot).

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

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final

from channels.db import database_sync_to_async
from django.contrib.auth import get_user
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from agent_platform.revocations import revocations_channel
from agent_platform.shutdown import is_stopping, wait_stopping
from sessions import stream_guard
from sessions.events import events_since, frame_text, live_channel
from sessions.live import live_join, live_leave
from sessions.stream_guard import InvalidAfterSeq, StreamCredential
from tenants.resolution import caller_resolve
from tenants.scoping import tenant_scope

logger = logging.getLogger(__name__)

PING_SECONDS: float = 15.0
"""A ``: ping`` comment this often (seconds); the stream slot is renewed at the same time."""
CATCH_UP_SECONDS: float = 5.0
"""How often the stream reads the replay stream for a frame the live fan-out dropped."""
RETRY_AFTER_SECONDS: Final[int] = 15


@database_sync_to_async
def _authorize(request: HttpRequest, session_id: int) -> tuple[int, str] | StreamCredential:
    """The caller's credential, or (status, message) when refused."""
    from sessions.selectors import chat_session_get_for_user

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
        if chat_session_get_for_user(session_id=session_id, user_id=user.pk) is None:
            return 404, "Session not found."
    return credential


def _message(frame: dict[str, Any]) -> str:
    return f"id: {frame['seq']}\nevent: {frame['type']}\ndata: {json.dumps(frame)}\n\n"


def _closed(reason: str) -> str:
    return f"event: stream_closed\ndata: {json.dumps({'reason': reason})}\n\n"


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
    response = StreamingHttpResponse(_stream(session_id=session_id, after_seq=after_seq, credential=credential,
                                             slot=slot), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


async def _stream(*, session_id: int, after_seq: int, credential: StreamCredential, slot: str) -> AsyncIterator[str]:
    """The SSE text: replay after ``after_seq``, then live frames in ``seq`` order, pings,
    until the client leaves, the credential stops authenticating or the process stops.
    Frees ``slot`` and leaves the live subscription when it ends (also when cancelled)."""
    loop = asyncio.get_running_loop()
    pending: deque[dict[str, Any] | None] = deque()
    wake = asyncio.Event()
    stopping = False
    revoked = False

    def listener(message: dict[str, Any] | None) -> None:
        pending.append(message)
        wake.set()

    def on_revoked(message: dict[str, Any] | None) -> None:
        nonlocal revoked
        if message is not None and message.get("token_id") == credential.token_id:
            revoked = True
            wake.set()

    async def watch_stop() -> None:
        nonlocal stopping
        await wait_stopping()
        stopping = True
        wake.set()

    channel = live_channel(session_id)
    joined = watching_revocations = False
    stopper = asyncio.ensure_future(watch_stop())
    last_seq = after_seq
    try:
        yield "retry: 1000\n\n"
        await live_join(channel, listener)
        joined = True
        if credential.token_id is not None:  # a revocation ends the stream at once
            await live_join(revocations_channel(), on_revoked)
            watching_revocations = True
        catch_up_seconds = CATCH_UP_SECONDS

        async def since_last() -> list[str]:
            nonlocal last_seq
            texts = []
            for frame in await events_since(session_id=session_id, after_seq=last_seq):
                if frame["seq"] > last_seq:
                    last_seq = frame["seq"]
                    texts.append(_message(frame))
            return texts

        for text in await since_last():
            yield text
        now = loop.time()
        next_ping, next_catch_up = now + PING_SECONDS, now + catch_up_seconds
        next_recheck = now + stream_guard.AUTH_RECHECK_SECONDS
        while True:
            if not pending and not stopping and not revoked:
                try:
                    async with asyncio.timeout(max(0.0, min(next_ping, next_catch_up, next_recheck) - loop.time())):
                        await wake.wait()
                except TimeoutError:
                    pass
                wake.clear()
            if stopping:
                yield _closed("server_stopping")
                return
            if revoked:
                yield _closed("unauthenticated")
                return
            while pending:
                message = pending.popleft()
                if message is None:  # the subscription was lost and restored
                    texts = await since_last()
                else:
                    frame = message["frame"] if "frame" in message else json.loads(
                        frame_text(message["seq"], message["body"]))
                    if frame["seq"] <= last_seq:
                        continue
                    texts = await since_last() if frame["seq"] > last_seq + 1 else []  # a gap: fill it in order
                    if frame["seq"] > last_seq:
                        last_seq = frame["seq"]
                        texts.append(_message(frame))
                for text in texts:
                    yield text
            now = loop.time()
            if now >= next_catch_up:
                next_catch_up = now + catch_up_seconds
                for text in await since_last():
                    yield text
            if now >= next_recheck:
                next_recheck = now + stream_guard.AUTH_RECHECK_SECONDS
                if not await stream_guard.credential_valid(credential):
                    yield _closed("unauthenticated")
                    return
            if now >= next_ping:
                next_ping = now + PING_SECONDS
                await stream_guard.stream_slot_renew(user_id=credential.user_id, slot=slot)
                yield ": ping\n\n"
    finally:
        stopper.cancel()
        if joined:
            live_leave(channel, listener)
        if watching_revocations:
            live_leave(revocations_channel(), on_revoked)
        try:
            await stream_guard.stream_slot_release(user_id=credential.user_id, slot=slot)
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself
            logger.warning("session %s: could not free a stream slot (%r); it expires by itself", session_id, exc)
