"""The session event reader (sessions/event_reader.py), without a transport: what the
WebSocket consumer and the SSE view both send comes from here, so each behaviour is checked
once against real Redis (the stream, the web process's live subscription): replay after
``after_seq``, live frames in order, a duplicate dropped, a gap filled from the stream, a
restored subscription and a lost last frame caught up, pings that renew the slot, and the
ends (a revoked token, a failed re-check, the process stopping). The transports' own tests
(test_events_ws.py, test_events_sse.py, test_stream_guards.py) check the encoding."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import pytest

from agent_platform import shutdown
from agent_platform.redis_clients import async_redis
from agent_platform.revocations import session_ended_publish, token_revoked_publish
from sessions import event_reader, stream_guard
from sessions.event_reader import Closed, Event, Ping, SessionEventReader
from sessions.events import _PUBLISH_LUA, event_body, event_publish, session_keys
from sessions.stream_guard import StreamCredential

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@pytest.fixture
def slots(monkeypatch) -> list[tuple[str, str]]:
    """The slot calls the reader makes, as ``(call, slot)``."""
    calls: list[tuple[str, str]] = []

    async def renew(*, user_id: int, slot: str) -> None:
        calls.append(("renew", slot))

    async def release(*, user_id: int, slot: str) -> None:
        calls.append(("release", slot))

    monkeypatch.setattr(stream_guard, "stream_slot_renew", renew)
    monkeypatch.setattr(stream_guard, "stream_slot_release", release)
    return calls


def _session_id() -> int:
    return 10**9 + uuid.uuid4().int % 10**9  # events only: no database row needed


def _reader(session_id: int, *, after_seq: int = 0, token_id: int | None = None,
            session_key: str | None = None) -> SessionEventReader:
    credential = StreamCredential(user_id=1, membership_id=1, token_id=token_id, session_key=session_key)
    return SessionEventReader(session_id=session_id, after_seq=after_seq, credential=credential, slot="slot-1")


async def _publish(session_id: int, text: str) -> dict:
    return await event_publish(session_id=session_id, run_id=None, type="content_token", data={"text": text})


async def _publish_unseen(session_id: int, text: str) -> int:
    """Stored in the stream but published on a channel nobody listens to: a dropped frame."""
    payload = json.dumps(event_body(session_id=session_id, run_id=None, type="content_token", data={"text": text}))
    keys = session_keys(session_id)
    return int(await async_redis().eval(_PUBLISH_LUA, 3, *keys, f"{keys[0]}:nobody", payload, 2000, 3600))


@contextlib.asynccontextmanager
async def _reading():
    """A reader of a new session, opened: ``(session_id, reader, its iterator)``; closed after."""
    session_id = _session_id()
    reader = _reader(session_id)
    await reader.open()
    try:
        yield session_id, reader, aiter(reader)
    finally:
        await reader.close()


async def _next(items, timeout: float = 5.0):
    return await asyncio.wait_for(anext(items), timeout)


async def _first_live(items, session_id: int) -> None:
    """Start the iteration (the replay: nothing), then publish a frame and take it live: from
    here on the reader is past its replay with nothing pending."""
    taken = asyncio.ensure_future(_next(items))
    await asyncio.sleep(0.1)
    assert not taken.done(), "nothing to replay"
    first = await _publish(session_id, "a")
    got = await taken
    assert got.seq == first["seq"]


def _texts(events: list) -> list[str]:
    return [json.loads(e.text)["data"]["text"] for e in events]


async def test_it_replays_after_after_seq_then_yields_live_frames_in_order_without_duplicates(slots) -> None:
    session_id = _session_id()
    old = [await _publish(session_id, t) for t in ("a", "b")]
    reader = _reader(session_id, after_seq=old[0]["seq"])
    await reader.open()
    items = aiter(reader)
    try:
        replayed = await _next(items)
        assert isinstance(replayed, Event) and replayed.seq == old[1]["seq"]
        assert json.loads(replayed.text) == old[1] and replayed.type == "content_token"
        live = await _publish(session_id, "c")
        reader._on_live({"seq": old[1]["seq"], "body": "{}"})  # a late duplicate: dropped
        got = await _next(items)
        assert (got.seq, json.loads(got.text)) == (live["seq"], live)
        assert got.text == json.dumps(live), "the frame's JSON, as json.dumps gives it (one line)"
    finally:
        await reader.close()
    assert slots == [("release", "slot-1")]
    await reader.close()
    assert slots == [("release", "slot-1")], "close is idempotent"


async def test_a_gap_before_a_live_frame_is_filled_from_the_stream_in_order(slots) -> None:
    session_id = _session_id()
    reader = _reader(session_id)
    await reader.open()
    items = aiter(reader)
    try:
        await _first_live(items, session_id)
        missed = [await _publish_unseen(session_id, t) for t in ("b", "c")]
        last = await _publish(session_id, "d")
        got = [await _next(items) for _ in range(3)]
        assert [e.seq for e in got] == [*missed, last["seq"]] and _texts(got) == ["b", "c", "d"]
    finally:
        await reader.close()


async def test_a_restored_subscription_makes_it_read_the_stream_at_once(slots, monkeypatch) -> None:
    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 3600.0)
    session_id = _session_id()
    reader = _reader(session_id)
    await reader.open()
    items = aiter(reader)
    try:
        await _first_live(items, session_id)
        seq = await _publish_unseen(session_id, "lost")
        pending = asyncio.ensure_future(_next(items))
        await asyncio.sleep(0.2)
        assert not pending.done(), "nothing live came, and the catch-up is an hour away"
        reader._on_live(None)  # what sessions.live tells a listener after a resubscription
        got = await pending
        assert (got.seq, _texts([got])) == (seq, ["lost"])
    finally:
        await reader.close()


async def test_a_lost_last_frame_is_caught_up_within_catch_up_seconds(slots, monkeypatch) -> None:
    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 0.2)
    session_id = _session_id()
    reader = _reader(session_id)
    await reader.open()
    items = aiter(reader)
    try:
        await _first_live(items, session_id)
        seq = await _publish_unseen(session_id, "last")
        got = await _next(items, timeout=3)
        assert (got.seq, _texts([got])) == (seq, ["last"])
    finally:
        await reader.close()


async def test_an_idle_readers_catch_up_reads_no_stream(slots, monkeypatch) -> None:
    """The catch-up looks at the session's last seq (one MGET shared by the loop's readers)
    and reads the stream only when frames are past the reader's; before, it read the stream
    (an XRANGE, usually empty) every period."""
    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 0.1)
    monkeypatch.setattr(event_reader, "CATCH_UP_BATCH_SECONDS", 0.05)
    reads: list[int] = []
    since = event_reader.events_since

    async def counted(**kwargs):
        reads.append(kwargs["after_seq"])
        return await since(**kwargs)

    async with _reading() as (session_id, _, items):
        await _first_live(items, session_id)
        monkeypatch.setattr(event_reader, "events_since", counted)
        pending = asyncio.ensure_future(_next(items))
        await asyncio.sleep(1.0)  # ~10 catch-ups due
        assert not pending.done() and reads == []
        seq = await _publish_unseen(session_id, "dropped")
        got = await asyncio.wait_for(pending, 3)
        assert (got.seq, _texts([got])) == (seq, ["dropped"])
        assert reads == [seq - 1]  # one read of the stream, for the frame past the reader's


async def test_readers_catch_ups_share_one_look(slots, monkeypatch) -> None:
    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 0.2)
    monkeypatch.setattr(event_reader, "CATCH_UP_BATCH_SECONDS", 0.3)
    looks: list[list[int]] = []
    last_seqs = event_reader.last_seqs

    async def counted(session_ids):
        looks.append(list(session_ids))
        return await last_seqs(session_ids)

    monkeypatch.setattr(event_reader, "last_seqs", counted)
    async with contextlib.AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(_reading()) for _ in range(3)]
        for session_id, _, items in opened:
            await _first_live(items, session_id)
        looks.clear()
        dropped = [await _publish_unseen(session_id, "dropped") for session_id, _, _ in opened]
        got = await asyncio.gather(*(_next(items, timeout=3) for _, _, items in opened))
        assert [e.seq for e in got] == dropped
        assert sorted(looks[0]) == sorted(session_id for session_id, _, _ in opened)  # one MGET for the three


async def test_a_failed_catch_up_look_propagates(slots, monkeypatch) -> None:
    async def failing(session_ids):
        raise ConnectionError("Redis is gone")

    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 0.1)
    monkeypatch.setattr(event_reader, "CATCH_UP_BATCH_SECONDS", 0.05)
    monkeypatch.setattr(event_reader, "last_seqs", failing)
    async with _reading() as (_, _, items):
        with pytest.raises(ConnectionError, match="Redis is gone"):
            await _next(items, timeout=3)


async def test_an_idle_reader_pings_after_renewing_its_slot(slots, monkeypatch) -> None:
    monkeypatch.setattr(event_reader, "PING_SECONDS", 0.1)
    reader = _reader(_session_id())
    await reader.open()
    items = aiter(reader)
    try:
        assert isinstance(await _next(items), Ping)
        assert slots == [("renew", "slot-1")]
        assert isinstance(await _next(items), Ping)
    finally:
        await reader.close()


async def test_revoking_its_token_ends_it_at_once_another_token_does_not(slots, monkeypatch) -> None:
    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 3600.0)
    session_id = _session_id()
    reader = _reader(session_id, token_id=424242)
    await reader.open()
    items = aiter(reader)
    try:
        await asyncio.to_thread(token_revoked_publish, token_id=424243)
        after = await _publish(session_id, "still open")
        assert (await _next(items)).seq == after["seq"]
        await asyncio.to_thread(token_revoked_publish, token_id=424242)
        ended = await _next(items, timeout=3)
        assert isinstance(ended, Closed) and ended.reason == "unauthenticated"
        with pytest.raises(StopAsyncIteration):
            await _next(items)
    finally:
        await reader.close()


async def test_ending_its_login_session_ends_it_at_once_another_session_does_not(slots, monkeypatch) -> None:
    """A cookie stream: a sign-out or the provider's back-channel logout announces the session's
    end (its key's digest, never the key), and the stream closes without waiting for a re-check."""
    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 3600.0)
    session_id = _session_id()
    reader = _reader(session_id, session_key="k" * 32)
    await reader.open()
    items = aiter(reader)
    try:
        await asyncio.to_thread(session_ended_publish, session_key="j" * 32)
        await asyncio.to_thread(token_revoked_publish, token_id=1)  # a token stream's, not this one
        after = await _publish(session_id, "still open")
        assert (await _next(items)).seq == after["seq"]
        await asyncio.to_thread(session_ended_publish, session_key="k" * 32)
        ended = await _next(items, timeout=3)
        assert isinstance(ended, Closed) and ended.reason == "unauthenticated"
    finally:
        await reader.close()


async def test_a_failed_recheck_ends_it(slots, monkeypatch) -> None:
    checked: list[StreamCredential] = []

    async def invalid(credential: StreamCredential) -> bool:
        checked.append(credential)
        return False

    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 0.2)
    monkeypatch.setattr(stream_guard, "credential_valid", invalid)
    reader = _reader(_session_id())
    await reader.open()
    items = aiter(reader)
    try:
        ended = await _next(items, timeout=3)
        assert isinstance(ended, Closed) and ended.reason == "unauthenticated"
        assert checked == [reader.credential]
    finally:
        await reader.close()


async def test_the_process_stopping_ends_it(slots) -> None:
    reader = _reader(_session_id())
    await reader.open()
    items = aiter(reader)
    try:
        pending = asyncio.ensure_future(_next(items))
        await asyncio.sleep(0.1)
        assert not pending.done()
        shutdown.shutdown_begin("test")
        ended = await pending
        assert isinstance(ended, Closed) and ended.reason == "server_stopping"
    finally:
        shutdown._reset_for_tests()
        await reader.close()


async def test_a_failed_read_of_the_stream_propagates(slots, monkeypatch) -> None:
    async def failing(**kwargs):
        raise ConnectionError("Redis is gone")

    reader = _reader(_session_id())
    await reader.open()
    items = aiter(reader)
    try:
        monkeypatch.setattr(event_reader, "events_since", failing)
        with pytest.raises(ConnectionError, match="Redis is gone"):
            await _next(items)  # the replay's read
    finally:
        await reader.close()


async def test_frames_flow_while_a_recheck_waits_for_the_database(slots, monkeypatch) -> None:
    """The re-check goes on beside the reading: a check stuck behind a busy connection pool
    does not hold the stream's frames back (it did: tokens seconds late under a burst of
    requests), and its answer ends the stream once it comes."""
    answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    checks: list[StreamCredential] = []

    async def slow(credential: StreamCredential) -> bool:
        checks.append(credential)
        return await answer

    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 0.1)
    monkeypatch.setattr(stream_guard, "credential_valid", slow)
    async with _reading() as (session_id, reader, items):
        await _first_live(items, session_id)
        # The reader does its timed work only while it is iterated: the next item is asked for
        # before the wait (the first re-check may be due only after the first live frame).
        taken = asyncio.ensure_future(_next(items, timeout=3))
        await asyncio.sleep(0.3)  # due at least twice: one check in flight, not one per period
        assert checks == [reader.credential]
        assert not taken.done(), "nothing to yield yet: the re-check is not awaited"
        live = await _publish(session_id, "while checking")
        assert (await asyncio.wait_for(taken, 1)).seq == live["seq"]
        answer.set_result(False)
        ended = await _next(items, timeout=3)
        assert isinstance(ended, Closed) and ended.reason == "unauthenticated"


async def test_a_recheck_that_raises_propagates(slots, monkeypatch) -> None:
    async def broken(credential: StreamCredential) -> bool:
        raise ConnectionError("the database is gone")

    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 0.1)
    monkeypatch.setattr(stream_guard, "credential_valid", broken)
    async with _reading() as (_, _, items):
        with pytest.raises(ConnectionError, match="the database is gone"):
            await _next(items, timeout=3)


def test_timed_work_of_readers_opened_together_is_spread_over_half_a_period() -> None:
    """Each reader's first ping, catch-up and re-check at period × [0.5, 1): readers opened
    in the same instant do not all query the database in the same instant every period."""
    assert event_reader.first_due(15.0, 0.0) == 7.5
    assert event_reader.first_due(15.0, 0.999) < 15.0
    loop = asyncio.new_event_loop()
    try:
        firsts = [event_reader._Deadlines(loop).recheck - loop.time() for _ in range(200)]
    finally:
        loop.close()
    period = stream_guard.AUTH_RECHECK_SECONDS
    assert all(period / 2 - 0.5 <= f <= period for f in firsts)
    assert max(firsts) - min(firsts) > period / 4, "spread, not all at one instant"
