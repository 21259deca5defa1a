"""Session event streams (WebSocket and SSE) under attack (issue 23: M1, M2, M3, L3, caps):
a revoked credential ends the stream, an idle SSE stream lives on and costs no Redis
connection, one user cannot hold more than STREAMS_PER_USER_MAX streams, a bad ``after_seq``
is refused, deep JSON does not kill the socket."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing.websocket import WebsocketCommunicator
from django.conf import settings

from agent_platform.asgi import application
from agents.tests.factories import agent_with_route
from sessions import stream_guard
from sessions.events import event_publish_sync
from sessions.services import chat_session_create
from tenants.models import ApiToken
from tenants.scoping import system_scope, tenant_scope
from tenants.services import api_token_revoke

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

THIRTY_DIGITS = "9" * 30


def make_session(world, user=None):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    with tenant_scope(world.tenant.pk):
        return chat_session_create(user=user or world.member, agent=agent)


def revoke_member_tokens(world):
    with system_scope():
        for token in ApiToken.all_tenants.filter(membership=world.member_membership):
            api_token_revoke(token=token)


def publish(session_id, text):
    event_publish_sync(session_id=session_id, run_id=None, type="content_token", data={"text": text})


@pytest.fixture
def quick_recheck(monkeypatch):
    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 0.3)


@pytest.fixture
def free_slots():
    """No stream slots left over from other tests (the test database restarts its user ids)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{settings.REDIS_KEY_PREFIX}:streams:*"):
        client.delete(key)


async def close_code(comm, timeout=5.0):
    """The close code the consumer sends, skipping data frames."""
    deadline = time.monotonic() + timeout
    while True:
        output = await comm.receive_output(timeout=max(0.1, deadline - time.monotonic()))
        if output["type"] == "websocket.close":
            return output["code"]


class SSE:
    """An SSE client on an httpx stream: frames as dicts {id, event, data, comment, retry}.

    Keep the object while the stream should stay open: its line iterator, once collected,
    closes the response (httpx), which the server sees as the client leaving."""

    def __init__(self, response):
        self.lines = response.aiter_lines()

    async def next(self, timeout=10.0):
        event: dict = {}
        async with asyncio.timeout(timeout):
            async for line in self.lines:
                if line.startswith(":"):
                    event["comment"] = line[1:].strip()
                elif line.startswith("id: "):
                    event["id"] = int(line[4:])
                elif line.startswith("event: "):
                    event["event"] = line[7:]
                elif line.startswith("data: "):
                    event["data"] = json.loads(line[6:])
                elif line.startswith("retry: "):
                    event["retry"] = line[7:]
                elif line == "" and event:
                    return event
        return None  # the response ended

    async def next_event(self, timeout=10.0):
        """The next frame that is not a ping comment or the retry hint."""
        while True:
            event = await self.next(timeout)
            if event is None or ("comment" not in event and "retry" not in event):
                return event


# --- M1: a revoked credential ends the stream -------------------------------------------------

async def test_a_websocket_opened_with_a_token_closes_4401_once_the_token_is_revoked(world, quick_recheck,
                                                                                      free_slots):
    session = await database_sync_to_async(make_session)(world)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    assert (await comm.connect())[0]
    await database_sync_to_async(publish)(session.pk, "before")
    assert (await comm.receive_json_from(timeout=5))["data"]["text"] == "before"
    await database_sync_to_async(revoke_member_tokens)(world)
    assert await close_code(comm, timeout=5) == 4401
    await comm.disconnect()


async def test_an_sse_stream_opened_with_a_token_ends_once_the_token_is_revoked(world, live_server_url, quick_recheck,
                                                                               free_slots):
    session = await database_sync_to_async(make_session)(world)
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("GET", url, headers={"Authorization": f"Bearer {world.member_token}"}) as response:
            assert response.status_code == 200
            sse = SSE(response)
            await database_sync_to_async(publish)(session.pk, "before")
            assert (await sse.next_event())["data"]["data"]["text"] == "before"
            await database_sync_to_async(revoke_member_tokens)(world)
            closed = await sse.next_event(timeout=5)
            await database_sync_to_async(publish)(session.pk, "after")
            assert closed == {"event": "stream_closed", "data": {"reason": "unauthenticated"}}
            assert await sse.next_event(timeout=5) is None  # the response ended; "after" never came


@pytest.fixture
def no_recheck(monkeypatch):
    """The periodic credential check out of the way: only the revocation message can act."""
    monkeypatch.setattr(stream_guard, "AUTH_RECHECK_SECONDS", 3600.0)


async def test_revoking_a_token_closes_its_websocket_and_sse_stream_at_once(world, live_server_url, no_recheck,
                                                                         free_slots):
    session = await database_sync_to_async(make_session)(world)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    assert (await comm.connect())[0]
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("GET", url, headers={"Authorization": f"Bearer {world.member_token}"}) as response:
            sse = SSE(response)
            await database_sync_to_async(publish)(session.pk, "before")
            assert (await sse.next_event())["data"]["data"]["text"] == "before"
            assert (await comm.receive_json_from(timeout=5))["data"]["text"] == "before"
            await database_sync_to_async(revoke_member_tokens)(world)
            assert await sse.next_event(timeout=3) == {"event": "stream_closed", "data": {"reason": "unauthenticated"}}
            assert await close_code(comm, timeout=3) == 4401
    await comm.disconnect()


async def test_an_sse_stream_on_the_login_cookie_ends_after_logout(world, live_server_url, quick_recheck, free_slots):
    from django.test import Client

    session = await database_sync_to_async(make_session)(world)
    browser = Client()
    await database_sync_to_async(browser.force_login)(world.member)
    cookies = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}
    async with httpx.AsyncClient(base_url=live_server_url, timeout=10, cookies=cookies) as client:
        async with client.stream("GET", f"/api/v1/sessions/{session.pk}/events") as response:
            assert response.status_code == 200
            sse = SSE(response)
            assert (await sse.next())["retry"] == "1000"
            await database_sync_to_async(browser.logout)()  # django.contrib.auth.logout: the session is flushed
            assert await sse.next_event(timeout=5) == {"event": "stream_closed", "data": {"reason": "unauthenticated"}}


@pytest.mark.parametrize("closed_by", ["quick_recheck", "no_recheck"])
async def test_a_websocket_on_the_login_cookie_closes_4401_after_logout(world, free_slots, request, closed_by):
    """``quick_recheck``: the periodic credential check closes it; ``no_recheck``: with that
    check out of the way, only the sign-out's announcement on Redis can, and does at once."""
    from django.test import Client

    request.getfixturevalue(closed_by)
    session = await database_sync_to_async(make_session)(world)
    browser = Client()
    await database_sync_to_async(browser.force_login)(world.member)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/",
                                 headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"),
                                          (b"cookie", cookie)])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from(timeout=5) == {"type": "pong"}  # open, authenticated by the cookie
    await database_sync_to_async(browser.logout)()
    assert await close_code(comm, timeout=5 if closed_by == "quick_recheck" else 3) == 4401
    await comm.disconnect()


# --- M2: SSE keepalive, no timeout, no pooled connection while idle ----------------------------

async def test_an_idle_sse_stream_outlives_the_redis_socket_timeout_and_is_pinged(world, live_server_url, free_slots,
                                                                                   monkeypatch):
    """Idle for 7 s (redis-py's 5 s socket timeout broke it), then a frame still arrives;
    with PING_SECONDS shortened, ``: ping`` comments arrive while idle."""
    from sessions import event_reader

    session = await database_sync_to_async(make_session)(world)
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream("GET", url, headers={"Authorization": f"Bearer {world.member_token}"}) as response:
            sse_client = SSE(response)
            assert (await sse_client.next())["retry"] == "1000"
            await asyncio.sleep(7)
            await database_sync_to_async(publish)(session.pk, "late")
            frame = await sse_client.next_event(timeout=10)
            assert frame is not None and frame["data"]["data"]["text"] == "late"
    monkeypatch.setattr(event_reader, "PING_SECONDS", 0.2)
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("GET", url, headers={"Authorization": f"Bearer {world.member_token}"}) as response:
            sse_client = SSE(response)
            await sse_client.next()  # retry
            assert (await sse_client.next())["data"]["data"]["text"] == "late"  # the replay
            assert await sse_client.next(timeout=5) == {"comment": "ping"}


async def test_idle_sse_streams_do_not_hold_the_web_processs_redis_connections(world, other_world, live_server_url,
                                                                               settings, free_slots):
    """70 idle SSE streams of one member (more than the web process's pool of 64) must not
    slow down another tenant's WebSocket: its first frame comes within 2 s (it waited up to
    10 s for a pooled connection when every SSE stream held one in a blocking XREAD)."""
    settings.STREAMS_PER_USER_MAX = 100
    session = await database_sync_to_async(make_session)(world)
    other_session = await database_sync_to_async(make_session)(other_world)
    await database_sync_to_async(publish)(other_session.pk, "hello")
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    headers = {"Authorization": f"Bearer {world.member_token}"}
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        opened: list = []
        readers: list[SSE] = []
        try:
            for _ in range(70):
                stream = client.stream("GET", url, headers=headers)
                response = await stream.__aenter__()
                opened.append(stream)
                assert response.status_code == 200
                readers.append(SSE(response))
                assert (await readers[-1].next())["retry"] == "1000"  # the stream is set up
            await asyncio.sleep(0.5)
            ws_url = live_server_url.replace("http://", "ws://")
            import websockets

            started = time.monotonic()
            async with websockets.connect(f"{ws_url}/ws/sessions/{other_session.pk}/?token={other_world.member_token}",
                                          open_timeout=10) as ws:
                first = json.loads(await asyncio.wait_for(ws.recv(), 15))
            elapsed = time.monotonic() - started
            assert first["data"]["text"] == "hello"
            assert elapsed < 2, f"another tenant's first frame took {elapsed:.1f} s"
        finally:
            for stream in opened:
                await stream.__aexit__(None, None, None)


# --- caps -------------------------------------------------------------------------------------

async def test_one_user_holds_at_most_streams_per_user_max_streams(world, live_server_url, settings, free_slots):
    settings.STREAMS_PER_USER_MAX = 2
    session = await database_sync_to_async(make_session)(world)
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    headers = {"Authorization": f"Bearer {world.member_token}"}
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("GET", url, headers=headers) as first:
            first_reader = SSE(first)
            assert (await first_reader.next())["retry"] == "1000"
            comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
            assert (await comm.connect())[0]
            # The socket is accepted before its slot is leased (a refusal is a close code); its
            # connect handler has finished, slot held, once it answers a ping (a fresh clone's CI
            # on a loaded machine saw the third stream win the slot and stream: ReadTimeout).
            await comm.send_json_to({"type": "ping"})
            assert await comm.receive_json_from(timeout=5) == {"type": "pong"}
            third = await client.get(url, headers=headers)
            assert third.status_code == 429
            assert third.json() == {"message": "Too many open event streams (at most 2 per user).",
                                    "extra": {"max_streams": 2}}
            assert int(third.headers["Retry-After"]) > 0
            over = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
            assert (await over.connect())[0]
            assert await close_code(over) == 4429
            await over.disconnect()
            await comm.disconnect()
            async with client.stream("GET", url, headers=headers) as again:  # a slot was freed
                assert again.status_code == 200


# --- L3: after_seq validation -----------------------------------------------------------------

@pytest.mark.parametrize("after_seq", [THIRTY_DIGITS, "-1", "12abc", str(2**63)])
async def test_a_websocket_with_a_bad_after_seq_is_closed_4400(world, after_seq, free_slots):
    session = await database_sync_to_async(make_session)(world)
    comm = WebsocketCommunicator(application,
                                 f"/ws/sessions/{session.pk}/?token={world.member_token}&after_seq={after_seq}")
    assert (await comm.connect())[0]
    assert await close_code(comm) == 4400
    await comm.disconnect()


async def test_sse_with_a_bad_after_seq_or_last_event_id_is_a_400(world, live_server_url, free_slots):
    session = await database_sync_to_async(make_session)(world)
    url = f"{live_server_url}/api/v1/sessions/{session.pk}/events"
    auth = {"Authorization": f"Bearer {world.member_token}"}
    async with httpx.AsyncClient(timeout=10) as client:
        for response in (await client.get(url, params={"after_seq": THIRTY_DIGITS}, headers=auth),
                         await client.get(url, headers={**auth, "Last-Event-ID": THIRTY_DIGITS}),
                         await client.get(url, headers={**auth, "Last-Event-ID": "-3"})):
            assert response.status_code == 400
            assert response.json() == {"message": "after_seq must be an integer from 0 to 9223372036854775807.",
                                       "extra": {"field": "after_seq"}}
        await database_sync_to_async(publish)(session.pk, "one")
        async with client.stream("GET", url, params={"after_seq": str(2**63 - 1)}, headers=auth) as ok:
            assert ok.status_code == 200


def test_parse_after_seq_bounds():
    assert stream_guard.parse_after_seq(None) == 0
    assert stream_guard.parse_after_seq("") == 0
    assert stream_guard.parse_after_seq("42") == 42
    assert stream_guard.parse_after_seq(str(2**63 - 1)) == 2**63 - 1
    for bad in (THIRTY_DIGITS, "-1", "1.5", "١٢", str(2**63), "0x10"):
        with pytest.raises(stream_guard.InvalidAfterSeq):
            stream_guard.parse_after_seq(bad)


# --- M3 on the session socket -----------------------------------------------------------------

async def test_deep_json_on_the_session_socket_is_refused_and_the_socket_stays(world, free_slots):
    session = await database_sync_to_async(make_session)(world)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    assert (await comm.connect())[0]
    await comm.send_to(text_data="[" * 20_000 + "]" * 20_000)
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and "nested deeper" in error["message"]
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from(timeout=5) == {"type": "pong"}
    await comm.disconnect()
