"""WebSocket /ws/sessions/<id>/: authentication, tenant isolation, ordered frames, replay."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async as sync_to_async
from channels.testing.websocket import WebsocketCommunicator

from agent_platform.asgi import application
from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.runner.loop import execute_run
from sessions.services import chat_session_create
from sessions.tests.conftest import post_message
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@sync_to_async
def make_session(world, url):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    bind_builtin(agent, "test_echo")
    bind_builtin(agent, "todo_write")
    with tenant_scope(world.tenant.pk):
        return chat_session_create(user=world.member, agent=agent)


async def receive_until(comm, last_type, limit=200):
    frames = []
    for _ in range(limit):
        frame = await comm.receive_json_from(timeout=10)
        frames.append(frame)
        if frame["type"] == last_type:
            return frames
    raise AssertionError(f"no {last_type} in {frames}")


async def test_a_runs_events_arrive_in_order_with_increasing_seq(world, fake_llm):
    session = await make_session(world, fake_llm.base_url)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    connected, _ = await comm.connect()
    assert connected
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "a"}),
                   ("todo_write", {"todos": [{"content": "say hi", "status": "in_progress", "priority": "high"}]})]),
        Reply("Done: echoed a."),
    )
    agent = await sync_to_async(lambda: session.agent)()
    run = await post_message(agent=agent, user=world.member, content="go", session=session)
    await execute_run(run.pk)
    frames = await receive_until(comm, "run_completed")
    await comm.disconnect()

    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap-free, strictly increasing"
    assert all(f["session_id"] == session.pk and f["run_id"] == run.pk for f in frames)
    types = [f["type"] for f in frames]
    assert types[:2] == ["run_queued", "run_running"]
    assert types[-1] == "run_completed" and frames[-1]["data"] == {"reply": "Done: echoed a."}
    assert types.count("tool_call_started") == 2
    assert sorted(f["data"]["name"] for f in frames if f["type"] == "tool_call_succeeded") == ["test_echo", "todo_write"]
    todo = next(f for f in frames if f["type"] == "todo_updated")
    assert todo["data"] == {"todos": [{"content": "say hi", "status": "in_progress", "priority": "high"}]}
    tokens = "".join(f["data"]["text"] for f in frames if f["type"] == "content_token")
    assert tokens == "Done: echoed a."
    assert types.index("tool_call_succeeded") < types.index("content_token")


async def test_reconnect_with_after_seq_replays_only_what_was_missed(world, fake_llm):
    session = await make_session(world, fake_llm.base_url)
    fake_llm.script(Reply("one two three"))
    agent = await sync_to_async(lambda: session.agent)()
    run = await post_message(agent=agent, user=world.member, content="go", session=session)
    await execute_run(run.pk)

    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    await comm.connect()
    everything = await receive_until(comm, "run_completed")
    await comm.disconnect()

    cut = everything[2]["seq"]
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}&after_seq={cut}")
    await comm.connect()
    replayed = await receive_until(comm, "run_completed")
    await comm.disconnect()
    assert replayed == [f for f in everything if f["seq"] > cut]


async def test_disconnect_mid_run_and_reconnect_with_after_seq_misses_nothing(world, fake_llm):
    import asyncio

    session = await make_session(world, fake_llm.base_url)
    text = "".join(f"word{i} " for i in range(40))
    fake_llm.script(ToolCalls([("test_echo", {"text": "a"})]),
                    Reply(text, chunk_size=5, chunk_interval_seconds=0.02))
    agent = await sync_to_async(lambda: session.agent)()
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    await comm.connect()
    run = await post_message(agent=agent, user=world.member, content="go", session=session)
    task = asyncio.create_task(execute_run(run.pk))
    before = []
    while not any(f["type"] == "content_token" for f in before):  # mid-stream
        before.append(await comm.receive_json_from(timeout=10))
    await comm.disconnect()
    await asyncio.sleep(0.2)  # events keep coming while the client is away

    comm = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/?token={world.member_token}&after_seq={before[-1]['seq']}")
    await comm.connect()
    after = await receive_until(comm, "run_completed")
    await comm.disconnect()
    await task
    seqs = [f["seq"] for f in before + after]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no gap, no duplicate"
    assert "".join(f["data"]["text"] for f in before + after if f["type"] == "content_token") == text


async def test_other_tenants_session_is_closed_with_4404(world, other_world, fake_llm):
    session = await make_session(world, fake_llm.base_url)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={other_world.member_token}")
    connected, _ = await comm.connect()
    assert connected
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}
    missing = WebsocketCommunicator(application, f"/ws/sessions/999999/?token={world.member_token}")
    await missing.connect()
    assert await missing.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}


async def test_bad_token_is_closed_with_4401(world, fake_llm):
    session = await make_session(world, fake_llm.base_url)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token=ap_nope")
    await comm.connect()
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}


async def test_browser_origin_from_another_site_is_refused(world, fake_llm):
    session = await make_session(world, fake_llm.base_url)
    comm = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/?token={world.member_token}",
        headers=[(b"origin", b"https://evil.example"), (b"host", b"127.0.0.1")],
    )
    connected, _ = await comm.connect()
    assert not connected


async def test_a_refused_origin_subscribes_to_nothing(world, fake_llm, monkeypatch):
    """The refusal happens before any consumer exists: nothing joins the live events."""
    from sessions import event_reader

    session = await make_session(world, fake_llm.base_url)
    joined: list[str] = []
    original = event_reader.live_join

    async def counting_live_join(channel, listener):
        joined.append(channel)
        await original(channel, listener)

    monkeypatch.setattr(event_reader, "live_join", counting_live_join)
    comm = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/?token={world.member_token}",
        headers=[(b"origin", b"https://evil.example"), (b"host", b"127.0.0.1")],
    )
    connected, code = await comm.connect()
    assert (connected, code) == (False, 1008)
    assert joined == []
    allowed = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/?token={world.member_token}",
        headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")],
    )
    assert (await allowed.connect())[0]
    await allowed.disconnect()
    assert len(joined) >= 1, "the allowed socket's consumer joined its session's live events"


async def test_live_events_do_not_hop_to_the_database_thread(world, fake_llm, monkeypatch):
    """Channels runs aclose_old_connections() (a sync-thread hop) before every handler; live
    events never touch the database and skip it, the socket's other messages do not."""
    from channels import consumer as channels_consumer

    from sessions.events import event_publish

    hops: list[int] = []
    original = channels_consumer.aclose_old_connections

    async def counting():
        hops.append(1)
        await original()

    monkeypatch.setattr(channels_consumer, "aclose_old_connections", counting)
    session = await make_session(world, fake_llm.base_url)
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session.pk}/?token={world.member_token}")
    assert (await comm.connect())[0]
    assert hops == [1], "websocket.connect went through Channels' dispatch"
    frames = [await event_publish(session_id=session.pk, run_id=None, type="todo_updated", data={"todos": [{"content": str(i), "status": "pending", "priority": "low"}]})
              for i in range(5)]
    assert [await comm.receive_json_from(timeout=5) for _ in frames] == frames
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from(timeout=5) == {"type": "pong"}
    assert hops == [1, 1], "only websocket.receive added one"
    await comm.disconnect()
