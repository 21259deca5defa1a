"""SSE /api/v1/sessions/<id>/events: replay after Last-Event-ID, live frames, isolation; and
the WebSocket's keepalive ping."""

from __future__ import annotations

import json

import httpx
import pytest

from agents.tests.factories import agent_with_route
from sessions.events import event_publish_sync
from sessions.services import chat_session_create
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def make_session(world, url="http://127.0.0.1:9/v1"):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    with tenant_scope(world.tenant.pk):
        return chat_session_create(user=world.member, agent=agent)


def read_frames(response, count):
    frames, event = [], {}
    for line in response.iter_lines():
        if line.startswith("id: "):
            event["id"] = int(line[4:])
        elif line.startswith("data: "):
            event["data"] = json.loads(line[6:])
        elif line == "" and event:
            frames.append(event)
            event = {}
            if len(frames) == count:
                return frames
    raise AssertionError(f"stream ended after {frames}")


def test_sse_replays_after_last_event_id_then_goes_live(world, live_server_url):
    session = make_session(world)
    for i in range(3):
        event_publish_sync(session_id=session.pk, run_id=None, type="content_token", data={"text": f"t{i}"})
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    headers = {"Authorization": f"Bearer {world.member_token}"}
    with httpx.stream("GET", url, headers=headers, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        first_three = read_frames(response, 3)
    assert [f["data"]["data"]["text"] for f in first_three] == ["t0", "t1", "t2"]
    seqs = [f["id"] for f in first_three]
    assert seqs == [f["data"]["seq"] for f in first_three] and seqs == sorted(seqs)

    with httpx.stream("GET", url, headers={**headers, "Last-Event-ID": str(seqs[1])}, timeout=10) as response:
        event_publish_sync(session_id=session.pk, run_id=None, type="content_token", data={"text": "live"})
        frames = read_frames(response, 2)
    assert [f["data"]["data"]["text"] for f in frames] == ["t2", "live"]
    assert frames[1]["id"] == seqs[2] + 1


def test_sse_hides_other_tenants_sessions_and_refuses_anonymous(world, other_world, live_server_url):
    session = make_session(world)
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    foreign = httpx.get(url, headers={"Authorization": f"Bearer {other_world.member_token}"}, timeout=10)
    assert foreign.status_code == 404 and foreign.json() == {"message": "Session not found.", "extra": {}}
    assert httpx.get(url, timeout=10).status_code == 401


async def test_the_websocket_pings_an_idle_client(world, monkeypatch):
    from channels.db import database_sync_to_async
    from channels.testing.websocket import WebsocketCommunicator

    from agent_platform.asgi import application
    from sessions import event_reader

    monkeypatch.setattr(event_reader, "PING_SECONDS", 0.1)
    session = await database_sync_to_async(make_session)(world)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    assert (await comm.connect())[0]
    assert await comm.receive_json_from(timeout=5) == {"type": "ping"}
    await comm.disconnect()


async def test_the_ping_task_ends_quietly_when_the_client_is_gone(monkeypatch):
    """A ping sent after the client left raises the server's OSError subclass (uvicorn's
    ClientDisconnected) before disconnect() cancels the task: the task ends, nothing is
    raised (it was logged as "Task exception was never retrieved"), nothing more is sent."""
    import asyncio

    from uvicorn.protocols.utils import ClientDisconnected

    from sessions import consumers
    from sessions.event_reader import PING

    consumer = consumers.SessionEventsConsumer()
    sent: list[dict] = []

    async def gone(content, close=False):
        sent.append(content)
        raise ClientDisconnected()

    async def pings():
        while True:
            yield PING

    monkeypatch.setattr(consumer, "send_json", gone)
    await asyncio.wait_for(consumer._pump(pings()), timeout=5)
    assert sent == [{"type": "ping"}]


def test_a_streams_session_check_is_the_chats_rule_asked_with_exists(world, other_world):
    """The WebSocket and SSE streams ask whether the caller may follow the chat with
    ``chat_session_visible_to_user``: the rule of ``chat_session_get_for_user`` (the caller's own
    chat, in the tenant in scope, not deleted), one EXISTS query that reads neither the chat's
    row nor its agent's."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from agents.models import AgentInstance
    from sessions.models import ChatSession
    from sessions.selectors import chat_session_get_for_user, chat_session_visible_to_user

    session = make_session(world)
    cases = [(world.tenant.pk, session.pk, world.member.pk), (world.tenant.pk, session.pk, world.admin.pk),
             (other_world.tenant.pk, session.pk, world.member.pk), (world.tenant.pk, session.pk + 1000, world.member.pk)]
    for tenant_id, session_id, user_id in cases:
        with tenant_scope(tenant_id):
            assert chat_session_visible_to_user(session_id=session_id, user_id=user_id) == (
                chat_session_get_for_user(session_id=session_id, user_id=user_id) is not None)
    with tenant_scope(world.tenant.pk):
        with CaptureQueriesContext(connection) as queries:
            assert chat_session_visible_to_user(session_id=session.pk, user_id=world.member.pk)
        ChatSession.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
        assert not chat_session_visible_to_user(session_id=session.pk, user_id=world.member.pk)
    [query] = queries.captured_queries
    assert query["sql"].startswith("SELECT 1 ") and AgentInstance._meta.db_table not in query["sql"], query["sql"]
