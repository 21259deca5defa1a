"""The per-loop cancel hub: one subscription and one poller for every run a loop hosts.

No database: these drive :func:`watch_for_cancel` directly against the test Redis.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from sessions.events import async_redis
from sessions.runner.cancellation import (
    POLL_INTERVAL_SECONDS,
    CancelHub,
    cancel_channel,
    cancel_key,
    hub_client_name,
    request_cancel_sync,
    watch_for_cancel,
)

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

RUN_IDS = range(9_100_000, 9_100_050)


@pytest.fixture(autouse=True)
def clean_keys():
    client = redis.Redis.from_url(_url())
    client.delete(*[cancel_key(r) for r in RUN_IDS])
    yield
    client.delete(*[cancel_key(r) for r in RUN_IDS])


def _url() -> str:
    from django.conf import settings

    return settings.REDIS_URL


async def _subscribers() -> int:
    counts = await async_redis().pubsub_numsub(cancel_channel())
    return int(counts[0][1])


async def _until(predicate, timeout_seconds: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_fifty_runs_share_one_subscription_and_a_cancel_ends_only_its_run():
    watches = {r: asyncio.create_task(watch_for_cancel(r)) for r in RUN_IDS}
    await _until(lambda: _is(CancelHub.for_running_loop().watched, len(RUN_IDS)))
    await asyncio.sleep(0.05)
    assert await _subscribers() == 1, "one pub/sub connection for the whole loop, not one per run"

    target = RUN_IDS[7]
    started = time.monotonic()
    await asyncio.to_thread(request_cancel_sync, target)
    await asyncio.wait_for(watches[target], timeout=2)
    assert time.monotonic() - started < POLL_INTERVAL_SECONDS, "the message, not the poll, ended the watch"
    await asyncio.sleep(0.05)
    assert [r for r, t in watches.items() if t.done()] == [target]

    for task in watches.values():
        task.cancel()
    await asyncio.gather(*watches.values(), return_exceptions=True)
    await _until(lambda: _is_zero_subscribers())
    assert CancelHub.for_running_loop().watched == 0


async def test_a_lost_message_is_caught_by_the_poll():
    run_id = RUN_IDS[0]
    watch = asyncio.create_task(watch_for_cancel(run_id))
    await _until(lambda: _is(CancelHub.for_running_loop().watched, 1))
    started = time.monotonic()
    await async_redis().set(cancel_key(run_id), "1", ex=60)  # the key without its PUBLISH
    await asyncio.wait_for(watch, timeout=3)
    assert time.monotonic() - started <= POLL_INTERVAL_SECONDS + 0.5


async def test_a_cancel_requested_before_the_watch_started_is_seen_at_once():
    run_id = RUN_IDS[1]
    await asyncio.to_thread(request_cancel_sync, run_id)
    await asyncio.wait_for(watch_for_cancel(run_id), timeout=POLL_INTERVAL_SECONDS / 2)


async def test_the_hub_subscribes_again_after_its_connection_is_killed():
    run_id = RUN_IDS[2]
    watch = asyncio.create_task(watch_for_cancel(run_id))
    await _until(lambda: _is_subscribers(1))
    ours = [c for c in await async_redis().client_list(_type="pubsub") if c.get("name") == hub_client_name()]
    assert len(ours) == 1
    await async_redis().client_kill_filter(_id=ours[0]["id"])
    await _until(lambda: _is_subscribers(1), timeout_seconds=5)
    await asyncio.sleep(0.05)
    assert not watch.done()
    started = time.monotonic()
    await asyncio.to_thread(request_cancel_sync, run_id)
    await asyncio.wait_for(watch, timeout=2)
    assert time.monotonic() - started < 1.0


async def test_two_watches_of_one_run_both_end_and_the_hub_stops_after_the_last():
    run_id = RUN_IDS[3]
    first = asyncio.create_task(watch_for_cancel(run_id))
    second = asyncio.create_task(watch_for_cancel(run_id))
    await _until(lambda: _is_subscribers(1))
    await asyncio.to_thread(request_cancel_sync, run_id)
    await asyncio.wait_for(asyncio.gather(first, second), timeout=2)
    await _until(lambda: _is_zero_subscribers())
    leftovers = [t.get_name() for t in asyncio.all_tasks() if "cancel-hub" in t.get_name()]
    assert leftovers == []


async def _is(value: int, expected: int) -> bool:
    return value == expected


async def _is_subscribers(n: int) -> bool:
    return await _subscribers() == n


async def _is_zero_subscribers() -> bool:
    return await _subscribers() == 0
