"""The publish script's own group send (sessions/events.py) against channels_redis.

The script writes channel-layer messages itself (one Redis round trip per event). These
tests pin it to what ``RedisChannelLayer.group_send`` does, through the real layer and
Redis, so an upgrade of channels_redis that changes its storage format fails here. Also:
an idle consumer survives the layer's blocking read (the channel layer's socket timeout).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from channels.layers import get_channel_layer

from sessions.events import (
    _layer_message,
    _script_fans_out,
    event_publish,
    event_publish_sync,
    frame_text,
    group_name,
)


def _session_id() -> int:
    return 10**9 + uuid.uuid4().int % 10**9  # no database row needed: events live in Redis


async def test_the_project_layer_takes_the_one_round_trip_path() -> None:
    assert _script_fans_out(get_channel_layer())


async def test_members_receive_exactly_what_group_send_delivers() -> None:
    layer = get_channel_layer()
    session_id = _session_id()
    group = group_name(session_id)
    local_a = await layer.new_channel()  # two process-specific channels: one Redis key, one message
    local_b = await layer.new_channel()
    plain = f"bench.plain.{uuid.uuid4().hex}"  # a non-process channel: its own key
    for channel in (local_a, local_b, plain):
        await layer.group_add(group, channel)
    try:
        frame = await event_publish(session_id=session_id, run_id=7, type="content_token", data={"text": "héllo"})
        via_script = [await asyncio.wait_for(layer.receive(c), 5) for c in (local_a, local_b, plain)]

        payload = json.dumps({k: v for k, v in frame.items() if k != "seq"})
        await layer.group_send(group, _layer_message(frame["seq"], payload))
        via_layer = [await asyncio.wait_for(layer.receive(c), 5) for c in (local_a, local_b, plain)]

        assert via_script == via_layer
        message = via_script[0]
        assert message == {"type": "session.event", "seq": frame["seq"], "body": payload}
        assert json.loads(frame_text(message["seq"], message["body"])) == frame
    finally:
        for channel in (local_a, local_b, plain):
            await layer.group_discard(group, channel)


async def test_stale_members_are_dropped_and_full_channels_skipped() -> None:
    layer = get_channel_layer()
    session_id = _session_id()
    group = group_name(session_id)
    stale, full, live = (f"bench.{name}.{uuid.uuid4().hex}" for name in ("stale", "full", "live"))
    connection = layer.connection(0)
    await connection.zadd(layer._group_key(group), {stale: int(time.time()) - layer.group_expiry - 10})
    await layer.group_add(group, full)
    await layer.group_add(group, live)
    for i in range(layer.capacity):
        await layer.send(full, {"type": "filler", "i": i})
    try:
        await event_publish(session_id=session_id, run_id=None, type="run_queued", data={})
        assert await connection.zscore(layer._group_key(group), stale) is None
        assert await connection.zcard(layer.prefix + full) == layer.capacity  # nothing added past capacity
        message = await asyncio.wait_for(layer.receive(live), 5)
        assert (message["type"], message["seq"]) == ("session.event", 1)
    finally:
        await connection.delete(layer.prefix + full, layer.prefix + live)
        await layer.group_discard(group, full)
        await layer.group_discard(group, live)


def test_the_sync_publisher_delivers_the_same_message() -> None:
    layer = get_channel_layer()
    session_id = _session_id()
    group = group_name(session_id)

    async def join() -> str:
        channel = f"bench.sync.{uuid.uuid4().hex}"
        await layer.group_add(group, channel)
        return channel

    channel = asyncio.run(join())
    frame = event_publish_sync(session_id=session_id, run_id=3, type="run_queued", data={"position": 2})

    async def receive() -> dict:
        try:
            return await asyncio.wait_for(layer.receive(channel), 5)
        finally:
            await layer.group_discard(group, channel)

    message = asyncio.run(receive())
    assert json.loads(frame_text(message["seq"], message["body"])) == frame


@pytest.mark.django_db(transaction=True)
async def test_an_idle_websocket_outlives_the_channel_layers_blocking_read(world) -> None:
    # channels_redis waits for messages with a 5 s BZPOPMIN; with redis-py 8's default 5 s
    # socket timeout the read timed out first and the consumer died (channels_redis#422).
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
    try:
        await asyncio.sleep(7)  # idle past the 5 s blocking read
        frame = await event_publish(session_id=session.pk, run_id=None, type="todo_updated", data={"todos": []})
        assert await comm.receive_json_from(timeout=5) == frame
    finally:
        await comm.disconnect()
