"""The cancel request's pub/sub message, on its own (issue 24).

``test_cancel_hub.py`` times a cancel against the 0.5 s poll interval, which the poll alone
meets most of the time. Here the poll is made far slower than the test may take (30 s), so
only the PUBLISH and the hub's subscription can end the watch in time.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from sessions.events import async_redis
from sessions.runner import cancellation
from sessions.runner.cancellation import CancelHub, cancel_channel, cancel_key, request_cancel_sync, watch_for_cancel

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

RUN_IDS = range(9_200_000, 9_200_003)
SLOW_POLL_SECONDS = 30.0


@pytest.fixture(autouse=True)
def clean_keys():
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*[cancel_key(r) for r in RUN_IDS])
    yield
    client.delete(*[cancel_key(r) for r in RUN_IDS])


@pytest.fixture
def slow_poll(monkeypatch):
    """The hub's key poll (the fallback) every 30 s: only pub/sub can be fast."""
    monkeypatch.setattr(cancellation, "POLL_INTERVAL_SECONDS", SLOW_POLL_SECONDS)


async def _until(predicate, timeout_seconds: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _subscribed() -> bool:
    counts = await async_redis().pubsub_numsub(cancel_channel())
    return int(counts[0][1]) == 1


@pytest.mark.usefixtures("slow_poll")
async def test_a_cancel_reaches_a_watching_run_through_pub_sub_alone():
    """Mutations: ``request_cancel_sync`` without its PUBLISH; the hub's reader not
    resolving the runs it is told about. Either way the watch would end only at the next
    poll, 30 s later."""
    target, other = RUN_IDS[0], RUN_IDS[1]
    watches = {r: asyncio.create_task(watch_for_cancel(r)) for r in (target, other)}
    try:
        await _until(lambda: _is(CancelHub.for_running_loop().watched, 2))
        await _until(_subscribed)
        await asyncio.sleep(0.05)  # past the watches' first key check
        started = time.monotonic()
        await asyncio.to_thread(request_cancel_sync, target)
        await asyncio.wait_for(watches[target], timeout=2.0)
        assert time.monotonic() - started < 1.0
        await asyncio.sleep(0.05)
        assert not watches[other].done(), "only the cancelled run's watch ends"
    finally:
        for task in watches.values():
            task.cancel()
        await asyncio.gather(*watches.values(), return_exceptions=True)


async def _is(value: int, expected: int) -> bool:
    return value == expected
