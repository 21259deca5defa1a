"""The web process's live subscription (sessions/live.py), against the real Redis and the
project's publish script, and the consumer's use of it (no channel layer)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from agent_platform.redis_clients import redis_stream_open
from sessions import live
from sessions.events import event_publish, frame_text, live_channel
from sessions.live import live_join, live_leave

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _session_id() -> int:
    return 10**9 + uuid.uuid4().int % 10**9  # no database row needed: events live in Redis


async def _subscribers(channel: str) -> int:
    admin = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        return dict(await admin.pubsub_numsub(channel))[channel.encode()]
    finally:
        await admin.aclose()


async def _next(queue: asyncio.Queue) -> dict | None:
    return await asyncio.wait_for(queue.get(), 5)


async def test_a_joined_listener_gets_every_later_publish_in_order_as_the_layer_would_deliver_it() -> None:
    session_id = _session_id()
    channel = live_channel(session_id)
    received: asyncio.Queue = asyncio.Queue()
    await live_join(channel, received.put_nowait)
    try:
        frames = [await event_publish(session_id=session_id, run_id=1, type="content_token", data={"text": f"t{i} é"})
                  for i in range(3)]
        messages = [await _next(received) for _ in frames]
        assert [m["seq"] for m in messages] == [f["seq"] for f in frames]
        for message, frame in zip(messages, frames, strict=False):
            assert message["type"] == "session.event" and type(message["seq"]) is int
            assert json.loads(frame_text(message["seq"], message["body"])) == frame
    finally:
        live_leave(channel, received.put_nowait)


async def test_listeners_share_one_subscription_and_the_last_to_leave_ends_it() -> None:
    session_id = _session_id()
    channel = live_channel(session_id)
    a: asyncio.Queue = asyncio.Queue()
    b: asyncio.Queue = asyncio.Queue()
    await live_join(channel, a.put_nowait)
    await live_join(channel, b.put_nowait)
    assert await _subscribers(channel) == 1
    first = await event_publish(session_id=session_id, run_id=None, type="todo_updated", data={"todos": []})
    assert (await _next(a))["seq"] == (await _next(b))["seq"] == first["seq"]

    live_leave(channel, a.put_nowait)
    second = await event_publish(session_id=session_id, run_id=None, type="todo_updated", data={"todos": [{"content": str(1), "status": "pending", "priority": "low"}]})
    assert (await _next(b))["seq"] == second["seq"]
    await asyncio.sleep(0.2)
    assert a.empty()

    live_leave(channel, b.put_nowait)
    for _ in range(50):  # the connection closes when nobody listens
        if await _subscribers(channel) == 0:
            break
        await asyncio.sleep(0.05)
    assert await _subscribers(channel) == 0
    live_leave(channel, b.put_nowait)  # leaving twice is harmless


async def test_a_killed_connection_is_reopened_and_its_listeners_are_told_to_catch_up() -> None:
    session_id = _session_id()
    channel = live_channel(session_id)
    received: asyncio.Queue = asyncio.Queue()
    await live_join(channel, received.put_nowait)
    admin = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        writer = live._subscriber()._writer
        host, port = writer.get_extra_info("sockname")[:2]
        assert await admin.client_kill_filter(_type="pubsub", addr=f"{host}:{port}") == 1
        assert await asyncio.wait_for(received.get(), 10) is None  # resubscribed: read the stream
        after = await event_publish(session_id=session_id, run_id=None, type="todo_updated", data={"todos": [{"content": str(2), "status": "pending", "priority": "low"}]})
        assert (await _next(received))["seq"] == after["seq"]
    finally:
        live_leave(channel, received.put_nowait)
        await admin.aclose()


async def test_an_idle_subscription_is_pinged_and_stays_the_same_connection(monkeypatch) -> None:
    monkeypatch.setattr(live, "IDLE_PING_SECONDS", 0.2)
    session_id = _session_id()
    channel = live_channel(session_id)
    received: asyncio.Queue = asyncio.Queue()
    await live_join(channel, received.put_nowait)
    try:
        writer = live._subscriber()._writer
        await asyncio.sleep(1.0)  # several pings answered; a missed answer would drop the connection
        assert live._subscriber()._writer is writer and received.empty()
        frame = await event_publish(session_id=session_id, run_id=None, type="todo_updated", data={"todos": []})
        assert (await _next(received))["seq"] == frame["seq"]
    finally:
        live_leave(channel, received.put_nowait)


async def test_a_subscription_redis_stops_answering_is_given_up_and_reopened(monkeypatch) -> None:
    confirmations = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal confirmations
        while line := await reader.readline():  # answers the handshake and SUBSCRIBE, never PING
            if line.startswith(b"*"):
                parts = [(await reader.readline(), await reader.readline())[1].strip() for _ in range(int(line[1:]))]
                if parts[0].upper() == b"SUBSCRIBE":
                    confirmations += 1
                    writer.write(b">3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(parts[1]), parts[1]))
                elif parts[0].upper() != b"PING":
                    writer.write(b"+OK\r\n")

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    monkeypatch.setattr(live, "redis_stream_open", lambda: redis_stream_open(url=url))
    monkeypatch.setattr(live, "IDLE_PING_SECONDS", 0.2)
    received: asyncio.Queue = asyncio.Queue()
    try:
        await live_join("some-channel", received.put_nowait)
        assert confirmations == 1
        assert await asyncio.wait_for(received.get(), 5) is None  # silent for 2 x 0.2 s: reopened, catch up
        assert confirmations == 2
    finally:
        live_leave("some-channel", received.put_nowait)
        server.close()


async def test_a_join_redis_never_confirms_times_out_and_leaves_nothing_behind(monkeypatch) -> None:
    from sessions.tests.test_events_fanout import _scripted_redis

    server = await _scripted_redis(eval_reply=None)  # "+OK" to everything, never a subscribe confirmation
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    monkeypatch.setattr(live, "redis_stream_open", lambda: redis_stream_open(url=url))
    monkeypatch.setattr(live, "JOIN_TIMEOUT_SECONDS", 0.3)
    subscriber = live._subscriber()
    received: asyncio.Queue = asyncio.Queue()
    try:
        with pytest.raises(TimeoutError):
            await live_join("some-channel", received.put_nowait)
        assert subscriber._listeners == {} and subscriber._confirmations == {}
    finally:
        server.close()


# --- the consumer takes live events from here only -----------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_consumer_uses_no_channel_layer_and_gets_live_frames_from_the_subscription(world) -> None:
    """No channel is made for a socket on any layer (Channels answers None for the consumer's
    alias, which no CHANNEL_LAYERS entry names); frames come through sessions.live."""
    from channels.layers import get_channel_layer

    from sessions.consumers import SessionEventsConsumer
    from sessions.tests.test_events_fanout import _connected

    assert get_channel_layer(SessionEventsConsumer.channel_layer_alias) is None
    session, comm = await _connected(world)
    try:
        first = await event_publish(session_id=session.pk, run_id=None, type="run_running", data={})
        second = await event_publish(session_id=session.pk, run_id=None, type="run_completed", data={"reply": "ok"})
        assert await comm.receive_json_from(timeout=5) == first
        assert await comm.receive_json_from(timeout=5) == second
        assert await comm.receive_nothing(timeout=0.3)
        assert await _subscribers(live_channel(session.pk)) == 1, "the web process's one subscription"
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_consumer_that_cannot_read_the_stream_after_a_lost_subscription_closes_with_1011(world, monkeypatch) -> None:
    from sessions import event_reader
    from sessions.tests.test_events_fanout import _connected

    session, comm = await _connected(world)
    admin = aioredis.Redis.from_url(settings.REDIS_URL)

    async def failing(**kwargs):
        raise redis.ConnectionError("Redis is gone")

    try:
        first = await event_publish(session_id=session.pk, run_id=None, type="run_running", data={})
        assert await comm.receive_json_from(timeout=5) == first
        monkeypatch.setattr(event_reader, "events_since", failing)  # the catch-up after the lost subscription fails
        host, port = live._subscriber()._writer.get_extra_info("sockname")[:2]
        assert await admin.client_kill_filter(_type="pubsub", addr=f"{host}:{port}") == 1
        assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 1011}
    finally:
        await comm.disconnect()
        await admin.aclose()
