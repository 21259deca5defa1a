"""WebSocket ``/ws/sessions/<id>/?after_seq=N``: a session's events, replayed then live.

What is sent comes from :class:`sessions.event_reader.SessionEventReader`, the transport-free
reader the SSE view (:mod:`sessions.sse`) shares; this consumer only checks the caller, encodes
and sends. On connect the reader joins the session's live events *first* (the join returns
once Redis has confirmed the subscription), then the replay from the Redis stream of every
frame after ``after_seq`` is sent; live frames with a ``seq`` already sent are dropped, so
nothing published after the join can be missed and nothing is sent twice.

Live frames come from the session's Redis pub/sub channel
(:func:`~sessions.events.live_channel`) through :mod:`sessions.live` (one subscription per web
process); the consumer uses no channel layer. Pub/sub may drop a frame (the subscription
reconnecting): the reader fills a gap from the stream, reads the stream at once after a
restored subscription, and when its look at the session's last ``seq`` (every
``CATCH_UP_SECONDS``) finds a dropped *last* frame, so a client
always ends up with every frame, in order. A ``{"type": "ping"}`` frame (no ``seq``) every
``PING_SECONDS`` keeps idle connections and proxies alive.

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
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agent_platform.api_parsers import JSONDepthError, json_loads_bounded
from sessions import stream_guard
from sessions.event_reader import Closed, Event, Item, SessionEventReader
from sessions.stream_guard import InvalidAfterSeq, StreamCredential
from tenants.scoping import tenant_scope

logger = logging.getLogger(__name__)

CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_MANY_STREAMS = 4429
CLOSE_CODES = {"unauthenticated": CLOSE_UNAUTHENTICATED, "server_stopping": CLOSE_GOING_AWAY}
"""The close code of each :class:`~sessions.event_reader.Closed` reason."""
NO_CHANNEL_LAYER = "session-events-no-layer"
"""The consumer's ``channel_layer_alias``: no layer of that name is configured, so Channels
gives the consumer no channel (``get_channel_layer`` answers None for an alias that is not
configured): live frames come through :mod:`sessions.live`, and nothing is sent to the socket
through a layer."""


class SessionEventsConsumer(AsyncJsonWebsocketConsumer):
    """The WebSocket transport of :class:`~sessions.event_reader.SessionEventReader`: checks
    the caller, then sends what the reader yields (see the module docstring)."""

    channel_layer_alias = NO_CHANNEL_LAYER
    reader: SessionEventReader | None = None
    pump: asyncio.Task | None = None  # sends the reader's items

    async def connect(self) -> None:
        await self.accept()
        refusal = await self._refusal()
        if refusal is not None:
            await self.close(code=refusal)
            return
        try:
            await self.reader.open()
        except BaseException:
            await self._close_reader()  # the socket is closing: nothing must be held for it any more
            raise
        self.pump = asyncio.create_task(self._pump(self.reader))

    async def _refusal(self) -> int | None:
        """The close code refusing the socket, or None (then :attr:`reader` is set, holding a
        stream slot)."""
        tenant_id, user = self.scope.get("tenant_id"), self.scope.get("user")
        if tenant_id is None or user is None or not user.is_authenticated:
            return CLOSE_UNAUTHENTICATED
        session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode(), keep_blank_values=True)
        try:
            after_seq = stream_guard.parse_after_seq((query.get("after_seq") or [None])[0])
        except InvalidAfterSeq:
            return CLOSE_BAD_REQUEST
        if not await _session_visible(tenant_id=tenant_id, user_id=user.pk, session_id=session_id):
            return CLOSE_NOT_FOUND
        slot = await stream_guard.stream_slot_acquire(user_id=user.pk)
        if slot is None:
            return CLOSE_TOO_MANY_STREAMS
        self.reader = SessionEventReader(session_id=session_id, after_seq=after_seq,
                                         credential=self._credential(user.pk), slot=slot)
        return None

    def _credential(self, user_id: int) -> StreamCredential:
        token_id = self.scope.get("token_id")
        session = self.scope.get("session") if token_id is None else None
        return StreamCredential(user_id=user_id, membership_id=self.scope["membership_id"], token_id=token_id,
                                session_key=getattr(session, "session_key", None) if session else None)

    async def _pump(self, reader: AsyncIterator[Item]) -> None:
        """Send ``reader``'s items: an event as its JSON text, a ping as ``{"type": "ping"}``,
        the end as a close (4401 unauthenticated, 1001 server stopping); 1011 if reading fails
        (the client reconnects with ``after_seq``).

        Ends quietly when the client has gone: the ASGI server raises an ``OSError`` subclass
        from a send on a closed connection (ASGI spec, WebSocket "Send"; uvicorn's
        ``ClientDisconnected``), which can happen before :meth:`disconnect` cancels this task.
        """
        try:
            async for item in reader:
                if isinstance(item, Event):
                    await self.send(text_data=item.text)
                elif isinstance(item, Closed):
                    await self.close(code=CLOSE_CODES[item.reason])
                    return
                else:
                    await self.send_json({"type": "ping"})
        except OSError:
            return  # the client is gone; disconnect() cleans up
        except Exception:  # e.g. Redis failing a gap's read
            logger.exception("session %s: live delivery failed; closing the socket", self._session_id())
            await self.close(code=CLOSE_INTERNAL_ERROR)

    def _session_id(self) -> int | None:
        return self.reader.session_id if self.reader is not None else None

    async def _close_reader(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.close()

    async def disconnect(self, code: int) -> None:
        if self.pump is not None:
            self.pump.cancel()
        await self._close_reader()

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


@database_sync_to_async
def _session_visible(*, tenant_id: int, user_id: int, session_id: int) -> bool:
    from sessions.selectors import chat_session_visible_to_user

    with tenant_scope(tenant_id):
        return chat_session_visible_to_user(session_id=session_id, user_id=user_id)
