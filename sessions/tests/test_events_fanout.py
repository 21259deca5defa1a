"""Live fan-out of session events (sessions/events.py): the publish script PUBLISHes each event
on the session's own channel (``live_channel``), as the msgpack of ``{type, seq, body}``, in
the same round trip that stores it. These tests read that channel with a plain redis-py
subscription. Pub/sub may drop a message; the consumer must still deliver every frame: a lost
last frame is caught up from the stream, and a killed subscription recovers. Also: an idle
consumer survives redis-py's default socket timeout; the loop's pipelined publisher.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import msgpack
import pytest
import redis.asyncio as aioredis
from django.conf import settings

from agent_platform.redis_clients import sync_redis
from sessions.events import (
    _PUBLISH_LUA,
    event_publish,
    event_publish_sync,
    frame_text,
    live_channel,
)

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _session_id() -> int:
    return 10**9 + uuid.uuid4().int % 10**9  # no database row needed: events live in Redis


async def _subscribed(channel: str):
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
    return client, pubsub


async def _next_message(pubsub) -> dict:
    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
    assert message is not None, "nothing published"
    return msgpack.unpackb(message["data"])


def test_the_live_channel_is_a_name_of_ours_under_the_key_prefix() -> None:
    assert live_channel(7) == f"{settings.REDIS_KEY_PREFIX}:session:7:live"
    assert "__group__" not in live_channel(7)  # not channels_redis's private group naming


async def test_an_async_publish_is_published_on_the_session_s_channel() -> None:
    session_id = _session_id()
    client, pubsub = await _subscribed(live_channel(session_id))
    try:
        frame = await event_publish(session_id=session_id, run_id=7, type="content_token", data={"text": "héllo"})
        message = await _next_message(pubsub)
        payload = json.dumps({k: v for k, v in frame.items() if k != "seq"})
        assert message == {"type": "session.event", "seq": frame["seq"], "body": payload}
        assert type(message["seq"]) is int
        assert json.loads(frame_text(message["seq"], message["body"])) == frame
    finally:
        await pubsub.aclose()
        await client.aclose()


async def test_the_sync_publisher_publishes_the_same_message() -> None:
    session_id = _session_id()
    client, pubsub = await _subscribed(live_channel(session_id))
    try:
        frame = await asyncio.to_thread(
            event_publish_sync, session_id=session_id, run_id=3, type="run_queued", data={"input": "hello"}
        )
        message = await _next_message(pubsub)
        assert json.loads(frame_text(message["seq"], message["body"])) == frame
    finally:
        await pubsub.aclose()
        await client.aclose()


# --- through the consumer ----------------------------------------------------------------------


async def _connected(world):
    from channels.db import database_sync_to_async
    from channels.testing.websocket import WebsocketCommunicator

    from agent_platform.asgi import application
    from agents.tests.factories import agent_with_route
    from sessions.services import chat_session_create
    from tenants.scoping import tenant_scope

    @database_sync_to_async
    def make_session():
        agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
        with tenant_scope(world.tenant.pk):
            return chat_session_create(user=world.member, agent=agent)

    session = await make_session()
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    connected, _ = await comm.connect()
    assert connected
    return session, comm


async def _publish_without_fanout(session_id: int, type: str, data: dict) -> int:
    """An event that reaches the stream but whose live message pub/sub dropped."""
    from sessions.events import async_redis, event_body, session_keys

    payload = json.dumps(event_body(session_id=session_id, run_id=None, type=type, data=data))
    keys = session_keys(session_id)  # published on a channel nobody listens to: "dropped"
    return int(await async_redis().eval(_PUBLISH_LUA, 3, *keys, f"{keys[0]}:nobody", payload, 2000, 3600))


@pytest.mark.django_db(transaction=True)
async def test_a_lost_last_frame_is_caught_up_from_the_stream(world, monkeypatch) -> None:
    from sessions import event_reader

    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 0.2)
    session, comm = await _connected(world)
    try:
        first = await event_publish(session_id=session.pk, run_id=None, type="run_running", data={})
        assert await comm.receive_json_from(timeout=5) == first  # joined and replayed: now live
        seq = await _publish_without_fanout(session.pk, "run_completed", {"reply": "done"})
        frame = await comm.receive_json_from(timeout=5)
        assert (frame["seq"], frame["type"], frame["data"]) == (seq, "run_completed", {"reply": "done"})
        assert await comm.receive_nothing(timeout=0.5)  # caught up once, not again
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_killed_subscription_resubscribes_and_nothing_is_lost(world, monkeypatch) -> None:
    from sessions import event_reader

    monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 0.3)
    session, comm = await _connected(world)
    admin = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        first = await event_publish(session_id=session.pk, run_id=None, type="todo_updated", data={"todos": []})
        assert await comm.receive_json_from(timeout=5) == first

        from sessions import live

        host, port = live._subscriber()._writer.get_extra_info("sockname")[:2]  # the web process's subscription
        assert await admin.client_kill_filter(_type="pubsub", addr=f"{host}:{port}") == 1
        during = await event_publish(session_id=session.pk, run_id=None, type="todo_updated", data={"todos": [{"content": str(1), "status": "pending", "priority": "low"}]})
        assert await comm.receive_json_from(timeout=10) == during  # live or caught up: either way, once

        monkeypatch.setattr(event_reader, "CATCH_UP_SECONDS", 100)  # from the next tick on: live delivery only
        await asyncio.sleep(1)  # the subscription is reopened at once
        after = await event_publish(session_id=session.pk, run_id=None, type="todo_updated", data={"todos": [{"content": str(2), "status": "pending", "priority": "low"}]})
        assert await comm.receive_json_from(timeout=5) == after
        assert await comm.receive_nothing(timeout=0.7)
    finally:
        await comm.disconnect()
        await admin.aclose()


@pytest.mark.django_db(transaction=True)
async def test_an_idle_websocket_outlives_the_layers_socket_timeout(world) -> None:
    # redis-py 8 defaults socket_timeout to 5 s; an idle subscription must not die of it
    # (with the core layer's 5 s BZPOPMIN it did: channels_redis#422).
    session, comm = await _connected(world)
    try:
        await asyncio.sleep(7)
        frame = await event_publish(session_id=session.pk, run_id=None, type="todo_updated", data={"todos": []})
        assert await comm.receive_json_from(timeout=5) == frame
    finally:
        await comm.disconnect()


async def _scripted_redis(*, eval_reply: bytes | None) -> asyncio.Server:
    """A stand-in Redis on a free port: "+OK" to the connection's handshake (HELLO, CLIENT
    SETINFO, ...), ``eval_reply`` to every EVAL (None: no answer at all)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            if line.startswith(b"*"):
                parts = [await reader.readline() for _ in range(2 * int(line[1:]))][1::2]
                reply = eval_reply if parts[0].strip().upper() == b"EVAL" else b"+OK\r\n"
                if reply is not None:
                    writer.write(reply)

    return await asyncio.start_server(serve, "127.0.0.1", 0)


# --- the loop's pipelined publisher --------------------------------------------------------------


async def test_publishes_get_seqs_in_the_order_they_were_made_and_share_writes(monkeypatch) -> None:
    from sessions import events

    writes = []
    original = asyncio.StreamWriter.write

    def counting_write(self, data):
        evals = bytes(data).count(b"$4\r\nEVAL\r\n")
        if evals:  # not the connection's handshake
            writes.append(evals)
        return original(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", counting_write)
    session_id = _session_id()
    frames = await asyncio.gather(*(
        event_publish(session_id=session_id, run_id=1, type="content_token", data={"text": str(i)}) for i in range(300)
    ))
    assert [f["seq"] for f in frames] == list(range(1, 301)), "made in this order (none awaited): seqs in this order"
    assert [f["data"]["text"] for f in frames] == [str(i) for i in range(300)]
    assert writes == [256, 44], "made in one loop iteration: written together, at most 256 commands a write"
    stored = await events.events_since(session_id=session_id, after_seq=0)
    assert [(f["seq"], f["data"]["text"]) for f in stored] == [(f["seq"], f["data"]["text"]) for f in frames]

    later = [await event_publish(session_id=session_id, run_id=1, type="content_token", data={"text": str(i)})
             for i in range(5)]
    assert [f["seq"] for f in later] == list(range(301, 306))


async def test_a_publish_does_not_wait_for_earlier_replies() -> None:
    from sessions import events

    session_id = _session_id()
    publisher = events._Publisher()
    assert await publisher.publish(events._script_args(session_id, "{}")) == 1  # connected
    connection, replies_may_be_read = publisher._connection, asyncio.Event()
    stream = connection.reader
    read = stream.read

    async def held_read(*args, **kwargs):
        await replies_may_be_read.wait()
        return await read(*args, **kwargs)

    stream.read = held_read
    first = publisher.publish(events._script_args(session_id, "{}"))
    for _ in range(50):  # until the sender has written it
        await asyncio.sleep(0)
    second = publisher.publish(events._script_args(session_id, "{}"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not first.done() and not publisher._queued and len(publisher._unanswered) == 2, (
        "the second one was written while the first one's reply was still unread"
    )
    replies_may_be_read.set()
    assert (await first, await second) == (2, 3)
    await publisher.aclose()


async def test_a_failed_connect_fails_its_publishes_and_the_next_ones_go_through() -> None:
    import redis

    from sessions import events

    broken = events._Publisher("redis://127.0.0.1:9")
    results = await asyncio.gather(*(broken.publish(events._script_args(_session_id(), "{}")) for _ in range(3)),
                                   return_exceptions=True)
    assert all(isinstance(r, redis.ConnectionError) for r in results)
    working = events._Publisher()
    assert await working.publish(events._script_args(_session_id(), "{}")) == 1
    await working.aclose()


async def test_a_killed_connection_is_replaced_and_nothing_is_stored_twice() -> None:
    from sessions import events

    session_id = _session_id()
    publisher = events._Publisher()
    assert await publisher.publish(events._script_args(session_id, "{}")) == 1
    connection = publisher._connection
    client_id = await publisher.command(("CLIENT", "ID"))
    sync_redis().execute_command("CLIENT", "KILL", "ID", client_id)  # while idle
    await asyncio.sleep(0.2)  # the close reaches this loop
    assert await publisher.publish(events._script_args(session_id, "{}")) == 2, "nothing lost"
    assert publisher._connection is not connection, "a new connection"

    # Killed while a publish waits for its reply: that one may fail, the next ones go through.
    client_id = await publisher.command(("CLIENT", "ID"))
    waiting = publisher.publish(events._script_args(session_id, "{}"))
    sync_redis().execute_command("CLIENT", "KILL", "ID", client_id)
    try:
        third = await waiting
    except Exception:  # noqa: BLE001 - stored or not: unknown, as the error says
        third = None
    fourth = await publisher.publish(events._script_args(session_id, "{}"))
    stored = [f["seq"] for f in await events.events_since(session_id=session_id, after_seq=0)]
    assert stored == sorted(set(stored)) and stored[-1] == fourth
    assert third is None or third in stored
    await publisher.aclose()


async def test_a_publish_redis_never_answers_fails_after_the_reply_timeout(monkeypatch) -> None:
    import redis

    from sessions import events

    server = await _scripted_redis(eval_reply=None)  # answers the handshake, never a script
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(events, "PUBLISH_REPLY_TIMEOUT_SECONDS", 0.3)
    publisher = events._Publisher(f"redis://127.0.0.1:{port}")
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(redis.TimeoutError):
            await publisher.publish(events._script_args(_session_id(), "{}"))
        assert asyncio.get_running_loop().time() - started < 2
        assert publisher._connection is None, "the connection was given up"
    finally:
        await publisher.aclose()
        server.close()


async def test_a_publish_made_without_waiting_comes_before_later_ones() -> None:
    from sessions import events

    session_id = _session_id()
    queued = [events.event_publish_nowait(session_id=session_id, run_id=1, type="content_token", data={"text": str(i)})
              for i in range(3)]
    last = await event_publish(session_id=session_id, run_id=1, type="run_completed", data={"reply": "012"})
    assert [await f for f in queued] == [1, 2, 3] and last["seq"] == 4
    stored = await events.events_since(session_id=session_id, after_seq=0)
    assert [f["type"] for f in stored] == ["content_token"] * 3 + ["run_completed"]
    with pytest.raises(ValueError, match="unknown event type"):
        events.event_publish_nowait(session_id=session_id, run_id=1, type="no_such_event", data={})


async def test_a_failing_command_fails_alone_and_a_malformed_reply_drops_the_connection() -> None:
    import redis

    from sessions import events

    session_id = _session_id()
    key = events.session_keys(session_id)[1]  # the session's stream: INCR of it is a WRONGTYPE error
    first = events.event_publish_nowait(session_id=session_id, run_id=1, type="content_token", data={"text": "a"})
    failing = events.pipelined_command("INCR", key)
    second = events.event_publish_nowait(session_id=session_id, run_id=1, type="content_token", data={"text": "b"})
    assert await first == 1
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        await failing
    assert await second == 2, "the commands after it are answered, on the same connection"
    connection = events._publisher()._connection
    assert await events.pipelined_command("EXISTS", key) == 1 and events._publisher()._connection is connection
    await events.publisher_aclose()

    server = await _scripted_redis(eval_reply=b"%%garbage\r\n")  # no RESP reply
    publisher = events._Publisher(f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        with pytest.raises(redis.InvalidResponse):
            await publisher.publish(events._script_args(_session_id(), "{}"))
        assert publisher._connection is None, "the connection was given up"
    finally:
        await publisher.aclose()
        server.close()


async def test_a_pipelined_command_s_nil_reply_is_a_reply_not_a_timeout() -> None:
    """``pipelined_command`` shares the publisher's connection: a nil reply (a GET of a missing
    key) comes back as None and the connection stays, in order with the publishes around it."""
    from sessions import events

    session_id = _session_id()
    first = events.event_publish_nowait(session_id=session_id, run_id=1, type="content_token", data={"text": "a"})
    missing = events.pipelined_command("GET", f"{_session_id()}:no-such-key")
    second = events.event_publish_nowait(session_id=session_id, run_id=1, type="content_token", data={"text": "b"})
    publisher = events._publisher()
    assert (await first, await missing, await second) == (1, None, 2)
    connection = publisher._connection
    assert connection is not None
    assert await events.pipelined_command("GET", f"{_session_id()}:no-such-key") is None
    assert publisher._connection is connection, "the same connection, not given up"
    await events.publisher_aclose()
