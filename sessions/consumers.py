"""WebSocket ``/ws/sessions/<id>/?after_seq=N``: a session's events, replayed then live.

On connect the consumer joins the session's live events *first* (the join returns once Redis
has confirmed the subscription), then replays from the Redis stream every frame after
``after_seq``; live frames with a ``seq`` it already sent are dropped. Live messages wait
until the replay is done and are then handled one at a time, so nothing published after the
join can be missed and nothing is sent twice.

Live frames come from the session's Redis pub/sub channel
(:func:`~sessions.events.live_channel`) through :mod:`sessions.live` (one subscription per web
process); the consumer uses no channel layer. The publish script stores and PUBLISHes each
event atomically, so frames arrive in ``seq`` order, but pub/sub may drop one (the
subscription reconnecting). A frame past ``last_seq + 1`` therefore makes the consumer read
the missing frames from the stream and send them in order (a late duplicate is dropped); a
subscription restored by :mod:`sessions.live` makes the consumer read the stream at once; and a dropped *last* frame is found by a check of the stream every
:data:`CATCH_UP_SECONDS`, so a client always ends up with every frame, in order.

Guards (:mod:`sessions.stream_guard`): a socket opened with an API token closes as soon as
the token is revoked (:mod:`agent_platform.revocations`); the credential the socket was
opened with (API token or login session) is re-checked every
:data:`~sessions.stream_guard.AUTH_RECHECK_SECONDS` (a removed membership, a deactivated user,
a logout, a lost revocation message);
a user holds at most ``STREAMS_PER_USER_MAX`` streams (WebSocket + SSE); the web process
stopping closes the socket (:mod:`agent_platform.shutdown`). Frames a client sends are JSON
nested at most 64 deep (else an ``{"type": "error"}`` frame; the socket stays open).

Close codes: 4401 not authenticated or no membership, or the credential was revoked while
open (token revoked, membership removed, user deactivated, logged out); 4400 ``after_seq``
is not an integer in 0..2**63-1; 4404 no such session for this caller (also another
tenant's or another user's: the same code for both); 4429 the user already has
``STREAMS_PER_USER_MAX`` streams open; 1001 the server is stopping; 1011 live delivery
failed (the stream could not be read), so the client reconnects with ``after_seq``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agent_platform.api_parsers import JSONDepthError, json_loads_bounded
from agent_platform.revocations import revocations_channel
from agent_platform.shutdown import wait_stopping
from sessions import stream_guard
from sessions.events import events_since, frame_text, live_channel
from sessions.live import live_join, live_leave
from sessions.stream_guard import InvalidAfterSeq, StreamCredential
from tenants.scoping import tenant_scope

logger = logging.getLogger(__name__)
_BACKGROUND: set[asyncio.Future] = set()
"""Fire-and-forget tasks, held until they end."""

CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_MANY_STREAMS = 4429
PING_SECONDS = 15.0
"""A ``{"type": "ping"}`` frame (no ``seq``) this often keeps idle connections and proxies alive."""
NO_CHANNEL_LAYER = "session-events-no-layer"
"""The consumer's ``channel_layer_alias``: no layer of that name is configured, so Channels
gives the consumer no channel (``get_channel_layer`` answers None for an alias that is not
configured): live frames come through :mod:`sessions.live`, and nothing is sent to the socket
through a layer."""
CATCH_UP_SECONDS = 5.0
"""How often a consumer reads the stream for frames the live fan-out dropped (one ``XRANGE``
after its last ``seq``, usually empty): the longest a lost last frame waits."""


class SessionEventsConsumer(AsyncJsonWebsocketConsumer):
    channel_layer_alias = NO_CHANNEL_LAYER
    session_id: int
    last_seq: int = 0
    pinger: asyncio.Task | None = None
    live_channel: str | None = None  # the pub/sub channel joined through sessions.live
    live: asyncio.Queue | None = None  # its messages (None: the subscription was restored), in order
    forwarder: asyncio.Task | None = None
    credential: StreamCredential | None = None  # re-checked while open
    slot: str | None = None  # the stream slot leased from stream_guard
    stopper: asyncio.Task | None = None  # closes the socket when the process stops
    revocations: str | None = None  # the revoked-tokens channel joined (token sockets)

    async def connect(self) -> None:
        await self.accept()
        tenant_id = self.scope.get("tenant_id")
        user = self.scope.get("user")
        if tenant_id is None or user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode(), keep_blank_values=True)
        try:
            self.last_seq = stream_guard.parse_after_seq((query.get("after_seq") or [None])[0])
        except InvalidAfterSeq:
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        if not await _session_visible(tenant_id=tenant_id, user_id=user.pk, session_id=self.session_id):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        token_id = self.scope.get("token_id")
        session = self.scope.get("session") if token_id is None else None
        self.credential = StreamCredential(user_id=user.pk, membership_id=self.scope["membership_id"],
                                           token_id=token_id,
                                           session_key=getattr(session, "session_key", None) if session else None)
        self.slot = await stream_guard.stream_slot_acquire(user_id=user.pk)
        if self.slot is None:
            await self.close(code=CLOSE_TOO_MANY_STREAMS)
            return
        self.stopper = asyncio.create_task(self._close_on_shutdown())
        if token_id is not None:  # a revocation closes the socket at once
            await live_join(revocations_channel(), self._on_revoked)
            self.revocations = revocations_channel()
        channel = live_channel(self.session_id)
        self.live = asyncio.Queue()
        await live_join(channel, self.live.put_nowait)
        self.live_channel = channel
        try:
            for frame in await events_since(session_id=self.session_id, after_seq=self.last_seq):
                await self._send_frame(frame)
        except BaseException:
            self._leave_live()  # the socket is closing: nothing must be queued for it any more
            raise
        if self.live is not None:  # what came during the replay waited in the queue
            self.forwarder = asyncio.create_task(self._forward_live(self.live))
        self.pinger = asyncio.create_task(self._ping_forever())

    def _leave_live(self) -> None:
        if self.live_channel is not None and self.live is not None:
            live_leave(self.live_channel, self.live.put_nowait)
            self.live_channel = None

    async def _forward_live(self, live: asyncio.Queue) -> None:
        """Hand the live messages to :meth:`session_event`, one at a time, in order; on
        ``None`` (the subscription was lost and restored) send what the stream has past
        ``last_seq``. Ends quietly when the client has gone (see :meth:`_ping_forever`)."""
        try:
            while True:
                message = await live.get()
                if message is None:
                    for missed in await events_since(session_id=self.session_id, after_seq=self.last_seq):
                        await self._send_frame(missed)
                else:
                    await self.session_event(message)
        except OSError:
            return
        except Exception:  # e.g. Redis failing the gap's read: the client reconnects with after_seq
            logger.exception("session %s: live delivery failed; closing the socket", self.session_id)
            await self.close(code=CLOSE_INTERNAL_ERROR)

    def _on_revoked(self, message: dict[str, Any] | None) -> None:
        """A revoked token (``{"token_id"}``, :mod:`agent_platform.revocations`): close 4401 if
        it is this socket's. ``None`` (the subscription was restored) waits for the recheck."""
        if message is not None and self.credential is not None and message.get("token_id") == self.credential.token_id:
            # Held until it ends: a dropped task may be garbage-collected mid-flight.
            task = asyncio.ensure_future(self.close(code=CLOSE_UNAUTHENTICATED))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

    async def _close_on_shutdown(self) -> None:
        await wait_stopping()
        await self.close(code=CLOSE_GOING_AWAY)

    async def _ping_forever(self) -> None:
        """Ping every PING_SECONDS (and renew the stream slot); every CATCH_UP_SECONDS, send
        what the stream has past ``last_seq``; every AUTH_RECHECK_SECONDS, close with 4401 if
        the credential no longer authenticates.

        Ends quietly when the client has gone: the ASGI server raises an ``OSError`` subclass
        from a send on a closed connection (ASGI spec, WebSocket "Send"; uvicorn's
        ``ClientDisconnected``), which can happen before :meth:`disconnect` cancels this task.
        """
        loop = asyncio.get_running_loop()
        next_ping, next_catch_up = loop.time() + PING_SECONDS, loop.time() + CATCH_UP_SECONDS
        next_recheck = loop.time() + stream_guard.AUTH_RECHECK_SECONDS
        try:
            while True:
                await asyncio.sleep(max(0.0, min(next_ping, next_catch_up, next_recheck) - loop.time()))
                now = loop.time()
                if now >= next_recheck and self.credential is not None:
                    next_recheck = now + stream_guard.AUTH_RECHECK_SECONDS
                    if not await stream_guard.credential_valid(self.credential):
                        await self.close(code=CLOSE_UNAUTHENTICATED)
                        return
                if now >= next_catch_up:
                    next_catch_up = now + CATCH_UP_SECONDS
                    for missed in await events_since(session_id=self.session_id, after_seq=self.last_seq):
                        await self._send_frame(missed)
                if now >= next_ping:
                    next_ping = now + PING_SECONDS
                    await self.send_json({"type": "ping"})
                    if self.slot is not None and self.credential is not None:
                        await stream_guard.stream_slot_renew(user_id=self.credential.user_id, slot=self.slot)
        except OSError:
            return  # the client is gone; disconnect() cleans up

    async def disconnect(self, code: int) -> None:
        for task in (self.pinger, self.forwarder, self.stopper):
            if task is not None:
                task.cancel()
        self._leave_live()
        if self.revocations is not None:
            live_leave(self.revocations, self._on_revoked)
            self.revocations = None
        if self.slot is not None and self.credential is not None:
            slot, self.slot = self.slot, None
            await stream_guard.stream_slot_release(user_id=self.credential.user_id, slot=slot)

    @classmethod
    async def decode_json(cls, text_data: str) -> Any:
        """JSON nested at most 64 deep (``JSONDepthError`` otherwise, never a RecursionError)."""
        return json_loads_bounded(text_data)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """A client frame: JSON (else an ``{"type": "error"}`` frame) handed to :meth:`receive_json`."""
        if text_data is None:
            await self.send_json({"type": "error", "message": "Frames must be JSON text."})
            return
        try:
            content = await self.decode_json(text_data)
        except JSONDepthError as exc:
            await self.send_json({"type": "error", "message": f"Invalid JSON: {exc}"[:200]})
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Clients only listen; a ping keeps intermediaries from closing an idle socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def session_event(self, message: dict[str, Any]) -> None:
        """A live event: ``{"seq", "body"}`` (body: the frame's JSON text without ``seq``, see
        :mod:`sessions.events`), or ``{"frame": {…}}``. Sent as text without decoding the body."""
        if "frame" in message:
            seq, text = message["frame"]["seq"], None
        else:
            seq, text = message["seq"], frame_text(message["seq"], message["body"])
        if seq > self.last_seq + 1:  # a gap: fill it from the stream, in order
            for missed in await events_since(session_id=self.session_id, after_seq=self.last_seq):
                await self._send_frame(missed)
        if seq <= self.last_seq:
            return
        self.last_seq = seq
        if text is None:
            await self.send_json(message["frame"])
        else:
            await self.send(text_data=text)

    async def _send_frame(self, frame: dict[str, Any]) -> None:
        if frame["seq"] <= self.last_seq:
            return
        self.last_seq = frame["seq"]
        await self.send_json(frame)


@database_sync_to_async
def _session_visible(*, tenant_id: int, user_id: int, session_id: int) -> bool:
    from sessions.selectors import chat_session_get_for_user

    with tenant_scope(tenant_id):
        return chat_session_get_for_user(session_id=session_id, user_id=user_id) is not None
