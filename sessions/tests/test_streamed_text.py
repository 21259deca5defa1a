"""How streamed text becomes content_token events: batched while it pours, never held back
by a pause, in order, and ahead of a model_retry when the stream breaks."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agent_platform.redis_clients import sync_redis
from agents.tests.factories import agent_with_route
from llm.testing import CutAfter, Reply
from sessions.events import events_since
from sessions.runner.loop import _StreamedTextBatcher, execute_run
from sessions.runner.ports import CallbackPublisher
from sessions.runner.streaming import TOKEN_FLUSH_SECONDS
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@sync_to_async
def make_agent(world, urls):
    return agent_with_route(tenant=world.tenant, base_urls=urls)


async def frames(session_id: int) -> list[dict]:
    return await events_since(session_id=session_id, after_seq=0)


async def test_text_before_a_pause_is_published_without_waiting_for_more(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    # Three chunks, 0.6 s apart: a slow model, or one that stops to think mid-answer.
    fake_llm.script(Reply("One, two, three", chunk_size=5, chunk_interval_seconds=0.6))
    run = await post_message(agent=agent, user=world.member, content="count")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).reply == "One, two, three"
    texts = [f["data"]["text"] for f in await frames(run.session_id) if f["type"] == "content_token"]
    assert texts == ["One, ", "two, ", "three"], "each chunk went out before the next arrived"


async def test_a_fast_stream_is_batched_and_nothing_is_lost_or_reordered(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    answer = " ".join(f"w{i}" for i in range(120))
    fake_llm.script(Reply(answer, chunk_size=3, chunk_interval_seconds=0.002))
    run = await post_message(agent=agent, user=world.member, content="stream")
    await execute_run(run.pk)
    texts = [f["data"]["text"] for f in await frames(run.session_id) if f["type"] == "content_token"]
    assert "".join(texts) == answer
    chunks = -(-len(answer) // 3)
    assert len(texts) < chunks / 3, f"{len(texts)} events for {chunks} chunks: not batched"


async def test_text_streamed_before_a_break_comes_before_the_retry(world, fake_llm):
    agent = await make_agent(world, [fake_llm.base_url])
    fake_llm.script(CutAfter("This answer will break off somewhere", 3), Reply("A complete answer."))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    types = [f["type"] for f in await frames(run.session_id)]
    retry = types.index("model_retry")
    assert "content_token" in types[:retry], "the first token of the broken answer went out at once"
    assert "run_completed" in types[retry:]
    after = [f["data"]["text"] for f in (await frames(run.session_id))[retry:] if f["type"] == "content_token"]
    assert "".join(after) == "A complete answer."


async def test_close_returns_only_after_text_that_came_during_a_publish_is_out():
    published: list[str] = []

    async def slow_publish(event_type: str, data: dict) -> None:
        await asyncio.sleep(0.05)
        published.append(data["text"])

    batcher = _StreamedTextBatcher(CallbackPublisher(slow_publish))
    batcher.add("content_token", "a")  # out at once: a publish is now in flight
    batcher.add("content_token", "b")  # within the interval: buffered
    await batcher.close()
    assert published == ["a", "b"], "the run must not go on (and end) before its last text is out"


async def test_text_does_not_wait_for_the_publish_in_flight_only_for_the_interval():
    started: list[tuple[float, str]] = []
    loop = asyncio.get_running_loop()

    async def slow_publish(event_type: str, data: dict) -> None:
        started.append((loop.time(), data["text"]))
        await asyncio.sleep(1.0)  # a slow round trip: far longer than the 25 ms interval

    # No sleeps between the adds (on a loaded machine a 10 ms sleep can outlast the interval):
    # "b" and "c" come within the interval since "a" whatever the load.
    batcher = _StreamedTextBatcher(CallbackPublisher(slow_publish))
    t0 = loop.time()
    batcher.add("content_token", "a")  # out at once
    batcher.add("content_token", "b")  # both go when the interval since "a" has passed...
    batcher.add("content_token", "c")
    while len(started) < 2 and loop.time() - t0 < 0.9:  # ...while "a"'s publish is still in flight
        await asyncio.sleep(0.005)
    assert [text for _, text in started] == ["a", "bc"]
    assert started[1][0] - t0 >= TOKEN_FLUSH_SECONDS - 0.001, "held for the interval since \"a\""
    assert started[1][0] - t0 < 0.9, "the second publish waited for the first to return"
    await batcher.close()
    assert [text for _, text in started] == ["a", "bc"]


async def test_a_failed_publish_is_raised_by_close():
    async def failing_publish(event_type: str, data: dict) -> None:
        await asyncio.sleep(0.01)
        raise ConnectionError("redis went away")

    batcher = _StreamedTextBatcher(CallbackPublisher(failing_publish))
    batcher.add("content_token", "a")
    with pytest.raises(ConnectionError, match="redis went away"):
        await batcher.close()


async def test_publishes_made_without_waiting_get_seqs_in_the_order_they_were_made():
    from sessions import events

    session_id = 10**9 + uuid.uuid4().int % 10**9  # events only: no database row needed
    sync_redis().delete(*events.session_keys(session_id))

    async def publish(event_type: str, data: dict) -> None:
        await events.event_publish(session_id=session_id, run_id=None, type=event_type, data=data)

    batcher = _StreamedTextBatcher(CallbackPublisher(publish))
    for i in range(40):  # 40 flushes, each as soon as the 25 ms interval allows
        batcher.add("content_token", f"{i},")
        await asyncio.sleep(0.03)
    await batcher.close()
    texts = [f["data"]["text"] for f in await frames(session_id)]
    assert "".join(texts) == "".join(f"{i}," for i in range(40)), "seq order is the stream's order"
    sync_redis().delete(*events.session_keys(session_id))


async def test_the_run_publisher_queues_without_a_task_per_event_in_call_order():
    """The production Publisher's nowait is the loop's pipelined publish itself (a future, not
    a task per event), and events keep the order of the calls."""
    from sessions import events
    from sessions.runner.adapters import RedisPublisher

    session_id = 10**9 + uuid.uuid4().int % 10**9
    publisher = RedisPublisher(session_id, 7)
    assert publisher.streamed is None, "kept only when the loop asks for it"
    sent = [publisher.nowait("content_token", {"text": t}) for t in ("a", "b", "c")]
    assert not any(isinstance(s, asyncio.Task) for s in sent)
    seqs = [await s for s in sent]
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]
    assert [(f["run_id"], f["data"]["text"]) for f in await frames(session_id)] == [(7, "a"), (7, "b"), (7, "c")]
    sync_redis().delete(*events.session_keys(session_id))


async def test_a_sub_run_publisher_adds_the_parent_s_ids_to_queued_events_too():
    from types import SimpleNamespace

    from sessions.runner.subrun import subrun_publishers

    recorded: list[tuple[str, dict]] = []

    async def record(event_type: str, data: dict) -> None:
        recorded.append((event_type, data))

    context = SimpleNamespace(tool_call_id=55)
    _, publish = subrun_publishers(CallbackPublisher(record), parent=SimpleNamespace(run_id=9), context=context,
                                   skill_name="s")
    await publish.nowait("content_token", {"text": "x"})
    await publish("model_retry", {"turn": 0})
    ids = {"parent_run_id": 9, "parent_tool_call_id": 55}
    assert recorded == [("content_token", {"text": "x", **ids}), ("model_retry", {"turn": 0, **ids})]
