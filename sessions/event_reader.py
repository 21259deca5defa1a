"""One reader of a session's events, whatever carries them to the client.

:class:`SessionEventReader` is the protocol every event transport shares (the WebSocket
consumer, :mod:`sessions.consumers`; the SSE view, :mod:`sessions.sse`): an async iterator of
typed items, written once, which a transport only encodes and sends.

- :class:`Event`: a frame, in ``seq`` order, each ``seq`` once. First the replay: every frame
  of the session's Redis stream after ``after_seq`` (the client's ``?after_seq`` or
  ``Last-Event-ID``); then the live frames (:mod:`sessions.live`). The live channel is joined
  *before* the replay (:meth:`SessionEventReader.open`), and live frames wait until the replay
  is done, so nothing published after the join is missed and nothing is yielded twice.
- Gaps: pub/sub is at-most-once. A live frame past ``last_seq + 1`` makes the reader read the
  missing frames from the stream first (a late duplicate is dropped); a subscription restored
  by :mod:`sessions.live` (its listener gets ``None``) makes it read the stream at once; and a
  lost *last* frame is found by a look at the session's last ``seq`` every
  :data:`CATCH_UP_SECONDS` (one ``MGET`` for the loop's readers that look within
  :data:`CATCH_UP_BATCH_SECONDS`), and read from the stream when it is past the reader's.
- :class:`Ping` every :data:`PING_SECONDS` (idle connections and proxies stay open), after
  the stream slot (:mod:`sessions.stream_guard`) has been renewed.
- :class:`Closed` (then the iteration ends): ``"unauthenticated"`` when the token the stream
  was opened with is revoked (:mod:`agent_platform.revocations`, at once) or the credential no
  longer authenticates (re-checked every ``stream_guard.AUTH_RECHECK_SECONDS``: a removed
  membership, a deactivated user, a logout, a lost revocation message); ``"server_stopping"``
  when the web process stops (:mod:`agent_platform.shutdown`).

Errors: a failed read of the stream (Redis gone) or of the credential propagates out of the
iteration; the transport ends the connection (the client reconnects with its last ``seq``).

The transport acquires the user's stream slot (its refusal differs: a 4429 close, a 429
answer) and hands it over; :meth:`SessionEventReader.close` leaves the live channels and frees
the slot, and must be awaited once the transport is done (also when it was cancelled).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

from agent_platform.loop_batch import LoopBatch
from agent_platform.revocations import revocations_channel, session_key_digest
from agent_platform.shutdown import wait_stopping
from sessions import stream_guard
from sessions.events import events_since, frame_text, last_seqs, live_channel
from sessions.live import Listener, live_join, live_leave
from sessions.stream_guard import StreamCredential

logger = logging.getLogger(__name__)

PING_SECONDS: float = 15.0
"""A :class:`Ping` this often (seconds); the stream slot is renewed at the same time."""
CATCH_UP_SECONDS: float = 5.0
"""How often the reader looks for frames the live fan-out dropped: it asks for its session's
last ``seq`` (:data:`_stream_heads`, one ``MGET`` for every reader of the loop asking within
:data:`CATCH_UP_BATCH_SECONDS`) and reads the stream only when that is past its own. A lost
last frame waits at most this + :data:`CATCH_UP_BATCH_SECONDS` (+ the reads)."""
CATCH_UP_BATCH_SECONDS: float = 0.5
"""How long a reader's look for dropped frames waits for the other readers' of its loop."""

CloseReason = Literal["unauthenticated", "server_stopping"]


class Event:
    """A frame: its ``seq`` and its JSON text (what ``json.dumps`` of the frame gives: one
    line). :attr:`type` is decoded from the text only when asked for (the WebSocket sends the
    text as it is)."""

    __slots__ = ("seq", "text", "_type")

    def __init__(self, seq: int, text: str, type: str | None = None) -> None:
        self.seq, self.text, self._type = seq, text, type

    @property
    def type(self) -> str:
        """The frame's event type (``sessions.event_types``)."""
        if self._type is None:
            self._type = json.loads(self.text)["type"]
        return self._type

    def __repr__(self) -> str:
        return f"Event(seq={self.seq}, text={self.text!r})"


class Ping:
    """Time for a keep-alive (the slot was renewed)."""

    __slots__ = ()


class Closed:
    """The stream ends (the last item): ``reason`` is ``"unauthenticated"`` or ``"server_stopping"``."""

    __slots__ = ("reason",)

    def __init__(self, reason: CloseReason) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Closed({self.reason!r})"


PING = Ping()
Item = Event | Ping | Closed


def _event_of(frame: dict[str, Any]) -> Event:
    return Event(frame["seq"], json.dumps(frame), frame["type"])


def _live_event(message: dict[str, Any]) -> Event:
    """A live message (``{"seq", "body"}``, body: the frame's JSON without ``seq``, or
    ``{"frame": {…}}``) as an :class:`Event`, without decoding the body."""
    if "frame" in message:
        return _event_of(message["frame"])
    return Event(message["seq"], frame_text(message["seq"], message["body"]))


def first_due(period: float, draw: float) -> float:
    """Seconds from a reader's start to the first of a timed task done every ``period``
    seconds: ``period × (0.5 + draw / 2)``, so in [period / 2, period) for ``draw`` in [0, 1).

    Each reader draws its own phase (:class:`_Deadlines`), so readers opened together (every
    client of a restarted web process reconnecting at once, a benchmark's clients) do not all
    re-check their credential (a database query each), read the stream and ping in the same
    instant of every period (bench/README.md, "Timed work spread"). Never later than
    ``period``, so the bounds the periods promise hold."""
    return period * (0.5 + draw / 2)


class _Deadlines:
    """When the next ping, catch-up read and credential re-check are due (loop time); the first
    of each at :func:`first_due` of its period, then every period."""

    __slots__ = ("loop", "ping", "catch_up", "recheck")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        now, draw = loop.time(), random.random()
        self.ping, self.catch_up = now + first_due(PING_SECONDS, draw), now + first_due(CATCH_UP_SECONDS, draw)
        self.recheck = now + first_due(stream_guard.AUTH_RECHECK_SECONDS, draw)

    def earliest(self) -> float:
        return min(self.ping, self.catch_up, self.recheck)


_stream_heads: LoopBatch[int, int] = LoopBatch(lambda session_ids: last_seqs(session_ids),
                                               lambda: CATCH_UP_BATCH_SECONDS)
"""The last ``seq`` of sessions' streams, asked for by each event loop's readers (their
catch-up) and read together: one ``MGET`` of the sessions' counters
(:func:`sessions.events.last_seqs`). Before, each reader read its stream (an ``XRANGE``
through redis-py, usually empty) every 5 s: 2.3 % of the web processes' time in a scale-out
round's profile once the credential re-checks were batched, the largest of the streams' timed
work, and an idle stream's largest cost (bench/README.md, "Credential re-checks together")."""


class SessionEventReader:
    """A session's events for one client (see the module docstring).

    Use: ``await reader.open()`` (joins the live channels; ``TimeoutError`` if Redis does not
    confirm), then ``async for item in reader`` (once), and ``await reader.close()`` at the end.

    Args:
        session_id: The session, already checked visible to the caller.
        after_seq: Frames with a higher ``seq`` are yielded (0: all the stream holds).
        credential: What the stream was opened with (re-checked; a token's revocation ends it).
        slot: The stream slot leased for it (:func:`sessions.stream_guard.stream_slot_acquire`),
            renewed at each ping and freed by :meth:`close`.
    """

    def __init__(self, *, session_id: int, after_seq: int, credential: StreamCredential, slot: str) -> None:
        self.session_id = session_id
        self.last_seq = after_seq
        self.credential = credential
        # The name of the cookie's login session on the revocations channel (None for a token).
        self._session_digest = session_key_digest(credential.session_key) if credential.session_key else None
        self._slot: str | None = slot
        self._pending: deque[dict[str, Any] | None] = deque()  # live messages not yet handled, in order
        self._wake = asyncio.Event()
        self._end: CloseReason | None = None
        self._joined: list[tuple[str, Listener]] = []
        self._stopper: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # wakes the reader for the timed work
        self._timer_due = False
        self._recheck: asyncio.Future[bool] | None = None  # the credential re-check in flight
        self._head: asyncio.Future[int] | None = None  # the catch-up's look at the stream's last seq
        self._behind = False  # that look found frames past last_seq: read them at the next wake-up
        self._failure: BaseException | None = None  # a re-check or a look that raised: out of the iteration

    # --- the client's signals ----------------------------------------------------------------

    def _on_live(self, message: dict[str, Any] | None) -> None:
        self._pending.append(message)
        self._wake.set()

    def _on_revoked(self, message: dict[str, Any] | None) -> None:
        """A revoked token (``{"token_id"}``) or an ended login session (``{"session"}``, its
        key's digest): the end if it is this stream's credential. ``None`` (the subscription was
        restored) waits for the re-check."""
        if message is None:
            return
        if self.credential.token_id is not None and message.get("token_id") == self.credential.token_id:
            self._end_with("unauthenticated")
        elif self._session_digest is not None and message.get("session") == self._session_digest:
            self._end_with("unauthenticated")

    def _on_head(self, head: asyncio.Future[int]) -> None:
        """The catch-up's look is done: frames past ``last_seq`` make the reader read the
        stream; an error ends the iteration (raised from it)."""
        self._head = None
        if head.cancelled():
            return
        if (error := head.exception()) is not None:
            self._failure = error
            self._wake.set()
        elif head.result() > self.last_seq:
            self._behind = True
            self._wake.set()

    def _on_rechecked(self, recheck: asyncio.Future[bool]) -> None:
        """A re-check is done: a credential that no longer authenticates ends the stream, an
        error ends the iteration (raised from it), a valid one changes nothing."""
        self._recheck = None
        if recheck.cancelled():
            return
        if (error := recheck.exception()) is not None:
            self._failure = error
            self._wake.set()
        elif not recheck.result():
            self._end_with("unauthenticated")

    def _end_with(self, reason: CloseReason) -> None:
        if self._end is None:
            self._end = reason
        self._wake.set()

    async def _watch_stopping(self) -> None:
        await wait_stopping()
        self._end_with("server_stopping")

    # --- life cycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Join the session's live channel (and, for a token or a login cookie, the revocations
        channel); returns once Redis confirmed. Raises ``TimeoutError`` (:func:`sessions.live.live_join`)."""
        self._stopper = asyncio.ensure_future(self._watch_stopping())
        if self.credential.token_id is not None or self._session_digest is not None:  # ends the stream at once
            await self._join(revocations_channel(), self._on_revoked)
        await self._join(live_channel(self.session_id), self._on_live)

    async def _join(self, channel: str, listener: Listener) -> None:
        await live_join(channel, listener)
        self._joined.append((channel, listener))

    async def close(self) -> None:
        """Leave the live channels and free the stream slot (idempotent; a slot that cannot be
        freed is logged: its lease expires by itself)."""
        if self._stopper is not None:
            self._stopper.cancel()
        if self._recheck is not None:
            self._recheck.cancel()
        if self._head is not None:
            self._head.cancel()
        joined, self._joined = self._joined, []
        for channel, listener in joined:
            live_leave(channel, listener)
        self._pending.clear()
        slot, self._slot = self._slot, None
        if slot is None:
            return
        try:
            await stream_guard.stream_slot_release(user_id=self.credential.user_id, slot=slot)
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself
            logger.warning("session %s: could not free a stream slot (%r); it expires by itself",
                           self.session_id, exc)

    # --- reading -----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Item]:
        return self._items()

    async def _items(self) -> AsyncIterator[Item]:
        for event in await self._since_last():
            yield event
        deadlines = _Deadlines(asyncio.get_running_loop())
        self._timer_at(deadlines)
        try:
            while True:
                if (not self._pending and self._end is None and not self._timer_due and self._failure is None
                        and not self._behind):
                    self._wake.clear()
                    await self._wake.wait()
                for item in self._in_order() or await self._next(deadlines):
                    yield item
                    if isinstance(item, Closed):
                        return
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self._recheck is not None:
                self._recheck.cancel()
            if self._head is not None:
                self._head.cancel()

    def _in_order(self) -> list[Item]:
        """The pending live frames that come next in ``seq`` order, taken without awaiting
        anything (the usual case: one frame per wake-up); ``[]`` when anything else is to be
        done first (the end, timed work, a gap, a duplicate, a restored subscription)."""
        items: list[Item] = []
        pending = self._pending
        if self._end is not None or self._timer_due or self._failure is not None or self._behind:
            return items
        while pending and pending[0] is not None and pending[0].get("seq") == self.last_seq + 1:
            message = pending.popleft()
            self.last_seq = seq = message["seq"]
            items.append(Event(seq, frame_text(seq, message["body"])))
        return items

    def _timer_at(self, deadlines: _Deadlines) -> None:
        """Wake the reader when the earliest timed work is due: one timer handle per ping,
        catch-up or re-check, not one per live frame."""
        self._timer = deadlines.loop.call_at(deadlines.earliest(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer_due = True
        self._wake.set()

    async def _next(self, deadlines: _Deadlines) -> list[Item]:
        """The items of a wake-up :meth:`_in_order` left: the end, or the events the live
        messages bring (in order) and the timed work if it is due. Raises what a re-check raised."""
        if self._failure is not None:
            raise self._failure
        if self._end is not None:
            return [Closed(self._end)]
        items = await self._drained() if self._pending else []
        if self._behind:  # the catch-up's look found frames the fan-out dropped
            self._behind = False
            items.extend(await self._since_last())
        if self._timer_due:
            self._timer_due = False
            items.extend(await self._due(deadlines))
            self._timer_at(deadlines)
        return items

    async def _drained(self) -> list[Item]:
        """The events the pending live messages bring, in order (until the end comes)."""
        items: list[Item] = []
        while self._pending and self._end is None:
            message = self._pending.popleft()
            event = _live_event(message) if message is not None else None
            if event is not None and event.seq == self.last_seq + 1:  # the usual case: nothing to await
                self.last_seq = event.seq
                items.append(event)
            else:
                items.extend(await self._live(message, event))
        return items

    async def _since_last(self) -> list[Event]:
        """The stream's frames after ``last_seq``, in order; ``last_seq`` advanced past them."""
        found = []
        for frame in await events_since(session_id=self.session_id, after_seq=self.last_seq):
            if frame["seq"] > self.last_seq:
                self.last_seq = frame["seq"]
                found.append(_event_of(frame))
        return found

    async def _live(self, message: dict[str, Any] | None, event: Event | None) -> list[Event]:
        """What one live message (``event``: its frame) brings: nothing (a duplicate), the
        frame, or the stream's frames up to it (a gap before it, or ``None``: the subscription
        was restored)."""
        if message is None or event is None:
            return await self._since_last()
        if event.seq <= self.last_seq:
            return []
        found = await self._since_last() if event.seq > self.last_seq + 1 else []  # a gap: fill it in order
        if event.seq > self.last_seq:
            self.last_seq = event.seq
            found.append(event)
        return found

    async def _due(self, deadlines: _Deadlines) -> list[Item]:
        """The timed work that is due: the re-check and the catch-up's look started (neither
        awaited: see below), the ping (the slot renewed first).

        The re-check (a database query, run on a thread from the process's connection pool)
        goes on beside the reading, one at a time, and ends the stream when it is done
        (:meth:`_on_rechecked`). Awaited here, it held back every frame of the stream until a
        pool connection was free: behind a burst of requests that held them all, tokens
        reached clients seconds late (bench/README.md, "Timed work spread")."""
        now = deadlines.loop.time()
        if now >= deadlines.recheck:
            deadlines.recheck = now + stream_guard.AUTH_RECHECK_SECONDS
            if self._recheck is None:
                self._recheck = asyncio.ensure_future(stream_guard.credential_valid(self.credential))
                self._recheck.add_done_callback(self._on_rechecked)
        if now >= deadlines.catch_up:
            deadlines.catch_up = now + CATCH_UP_SECONDS
            if self._head is None:  # frames past last_seq are read at the wake-up it brings (_on_head)
                self._head = _stream_heads.ask(self.session_id)
                self._head.add_done_callback(self._on_head)
        items: list[Item] = []
        if now >= deadlines.ping:
            deadlines.ping = now + PING_SECONDS
            if self._slot is not None:
                await stream_guard.stream_slot_renew(user_id=self.credential.user_id, slot=self._slot)
            items.append(PING)
        return items
