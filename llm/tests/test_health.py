"""Entry health: the same rule suite runs against MemoryEntryHealth and RedisEntryHealth (the
real Redis at 127.0.0.1:6379, a unique key prefix per test, keys deleted afterwards), plus
cross-process and atomicity tests for Redis."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from llm.clock import FakeClock, SystemClock
from llm.health import (
    DEFAULT_COOLDOWN_SECONDS,
    MAX_COOLDOWN_SECONDS,
    PROBE_LEASE_SECONDS,
    WINDOW_SECONDS,
    EntryHealth,
    HealthStateUnavailable,
    MemoryEntryHealth,
    RedisEntryHealth,
    cooldown_for,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "entry:42"


@dataclass
class World:
    health: EntryHealth
    clock: FakeClock


async def _drop_prefix(client: redis.asyncio.Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
    if keys:
        await client.delete(*keys)


@pytest.fixture
async def redis_client() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=5)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:llm-health:{uuid.uuid4().hex}"


@pytest.fixture(params=["memory", "redis", "redis-pipelined"])
async def world(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[World]:
    """Every rule below against the in-process store, the Redis one through redis-py, and the
    Redis one through the loop's pipelined connection (what the runner uses)."""
    clock = FakeClock()
    if request.param == "memory":
        yield World(MemoryEntryHealth(clock=clock), clock)
        return
    from sessions.events import pipelined_command, publisher_aclose

    client = redis.asyncio.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=5)
    execute = pipelined_command if request.param == "redis-pipelined" else None
    try:
        yield World(RedisEntryHealth(client, prefix=prefix, clock=clock, execute=execute), clock)
    finally:
        await publisher_aclose()
        await _drop_prefix(client, prefix)
        await client.aclose()


# --- the rules (both implementations) ---------------------------------------------------------------


def test_the_cooldown_table() -> None:
    assert dict(DEFAULT_COOLDOWN_SECONDS).items() >= {
        "rate_limit": 30.0, "overloaded": 30.0, "server": 30.0, "timeout": 30.0, "network": 30.0,
        "quota_exhausted": 3600.0, "auth": 600.0, "not_found": 600.0, "content_policy": 0.0,
    }.items()
    assert cooldown_for("something_new") == 30.0
    assert MAX_COOLDOWN_SECONDS == 3600.0 and WINDOW_SECONDS == 60.0


async def test_a_new_entry_is_closed(world: World) -> None:
    assert await world.health.available(KEY)
    snap = await world.health.snapshot(KEY)
    assert (snap.state, snap.cooldown_until, snap.calls_last_minute, snap.failures_last_minute, snap.last_error_class) == (
        "closed", None, 0, 0, None,
    )


async def test_more_than_half_failing_with_four_calls_opens(world: World) -> None:
    h = world.health
    for _ in range(3):
        await h.record_failure(KEY, "server", retries_exhausted=False)
    assert (await h.snapshot(KEY)).state == "closed"  # 3 calls: below the minimum of 4

    await h.record_failure(KEY, "server", retries_exhausted=False)

    snap = await h.snapshot(KEY)
    assert (snap.state, snap.cooldown_until, snap.calls_last_minute, snap.failures_last_minute) == (
        "open", world.clock.time() + 30, 4, 4,
    )
    assert not await h.available(KEY)


async def test_half_or_fewer_failures_keep_it_closed(world: World) -> None:
    h = world.health
    await h.record_success(KEY)
    await h.record_success(KEY)
    await h.record_failure(KEY, "timeout", retries_exhausted=False)
    await h.record_failure(KEY, "timeout", retries_exhausted=False)
    assert (await h.snapshot(KEY)).state == "closed"  # 2 of 4: not more than half

    await h.record_failure(KEY, "timeout", retries_exhausted=False)

    assert (await h.snapshot(KEY)).state == "open"  # 3 of 5


async def test_the_window_slides(world: World) -> None:
    h = world.health
    for _ in range(3):
        await h.record_failure(KEY, "network", retries_exhausted=False)
    world.clock.advance(WINDOW_SECONDS + 1)

    await h.record_failure(KEY, "network", retries_exhausted=False)

    snap = await h.snapshot(KEY)
    assert (snap.state, snap.calls_last_minute, snap.failures_last_minute) == ("closed", 1, 1)


@pytest.mark.parametrize(("error_class", "cooldown"), [("quota_exhausted", 3600), ("auth", 600), ("not_found", 600)])
async def test_non_retryable_statuses_open_at_once(world: World, error_class: str, cooldown: float) -> None:
    await world.health.record_failure(KEY, error_class)

    snap = await world.health.snapshot(KEY)
    assert (snap.state, snap.cooldown_until, snap.last_error_class) == ("open", world.clock.time() + cooldown, error_class)
    assert not await world.health.available(KEY)


async def test_rate_limit_opens_when_the_router_gives_up(world: World) -> None:
    h = world.health
    await h.record_failure(KEY, "rate_limit", retry_after_seconds=12, retries_exhausted=False)
    assert (await h.snapshot(KEY)).state == "closed"  # a retry is coming: only counted

    await h.record_failure(KEY, "rate_limit", retry_after_seconds=12, retries_exhausted=True)

    assert (await h.snapshot(KEY)).cooldown_until == world.clock.time() + 12


async def test_rate_limit_without_retry_after_opens_for_the_default(world: World) -> None:
    await world.health.record_failure(KEY, "rate_limit", retries_exhausted=True)

    assert (await world.health.snapshot(KEY)).cooldown_until == world.clock.time() + 30


async def test_a_long_retry_after_opens_for_that_long_capped_at_an_hour(world: World) -> None:
    await world.health.record_failure(KEY, "overloaded", retry_after_seconds=45)
    assert (await world.health.snapshot(KEY)).cooldown_until == world.clock.time() + 45

    await world.health.record_failure("entry:other", "rate_limit", retry_after_seconds=7200)

    assert (await world.health.snapshot("entry:other")).cooldown_until == world.clock.time() + MAX_COOLDOWN_SECONDS


async def test_after_the_cooldown_a_single_probe_goes_and_its_success_closes(world: World) -> None:
    h = world.health
    await h.record_failure(KEY, "auth")
    world.clock.advance(599)
    assert not await h.available(KEY)
    world.clock.advance(1)
    assert (await h.snapshot(KEY)).state == "half_open"

    assert await h.available(KEY)  # the probe
    assert not await h.available(KEY)  # everyone else waits for its outcome
    await h.record_success(KEY)

    snap = await h.snapshot(KEY)
    assert (snap.state, snap.cooldown_until, snap.calls_last_minute, snap.failures_last_minute) == ("closed", None, 1, 0)
    assert await h.available(KEY) and await h.available(KEY)


async def test_a_failed_probe_reopens_with_the_cooldown_doubled_up_to_an_hour(world: World) -> None:
    h = world.health
    for _ in range(4):
        await h.record_failure(KEY, "server", retries_exhausted=False)  # opens for 30 s
    expected = [60, 120, 240, 480, 960, 1920, 3600, 3600]
    seen = []
    for _ in expected:
        world.clock.advance((await h.snapshot(KEY)).cooldown_until - world.clock.time())  # type: ignore[operator]
        assert await h.available(KEY)
        await h.record_failure(KEY, "server", retries_exhausted=False)
        seen.append(round((await h.snapshot(KEY)).cooldown_until - world.clock.time()))  # type: ignore[operator]
    assert seen == expected


async def test_a_lost_probe_is_released_after_its_lease(world: World) -> None:
    h = world.health
    await h.record_failure(KEY, "not_found")
    world.clock.advance(600)
    assert await h.available(KEY)  # taken by a worker that then dies

    world.clock.advance(PROBE_LEASE_SECONDS - 1)
    assert not await h.available(KEY)
    world.clock.advance(1)
    assert await h.available(KEY)


async def test_content_policy_is_counted_but_never_opens(world: World) -> None:
    for _ in range(10):
        await world.health.record_failure(KEY, "content_policy")

    snap = await world.health.snapshot(KEY)
    assert (snap.state, snap.calls_last_minute, snap.failures_last_minute, snap.last_error_class) == (
        "closed", 10, 0, "content_policy",
    )


async def test_a_success_during_the_cooldown_does_not_close_early(world: World) -> None:
    # E.g. a call that started before the breaker opened finishes fine a moment later.
    h = world.health
    await h.record_failure(KEY, "quota_exhausted")

    await h.record_success(KEY)

    assert (await h.snapshot(KEY)).state == "open"


async def test_a_success_after_the_cooldown_closes_even_without_a_probe(world: World) -> None:
    # E.g. a call that took the entry when its cooldown ended, without asking for the probe
    # (another worker's snapshot moved it on), succeeds: the breaker closes.
    h = world.health
    await h.record_failure(KEY, "quota_exhausted")
    world.clock.advance(cooldown_for("quota_exhausted") + 1)

    await h.record_success(KEY)

    snapshot = await h.snapshot(KEY)
    assert snapshot.state == "closed"


async def test_the_cooldown_ends_at_its_instant_for_probes_and_successes_alike(world: World) -> None:
    # At exactly cooldown_until the entry is available (a probe) and a success closes it: the
    # two rules share one boundary (mutation testing found the success side's untested).
    h = world.health
    await h.record_failure(KEY, "quota_exhausted")
    world.clock.advance(cooldown_for("quota_exhausted"))

    await h.record_success(KEY)

    assert (await h.snapshot(KEY)).state == "closed"


async def test_failures_while_open_never_shorten_the_cooldown(world: World) -> None:
    h = world.health
    await h.record_failure(KEY, "quota_exhausted")
    until = (await h.snapshot(KEY)).cooldown_until

    await h.record_failure(KEY, "rate_limit", retry_after_seconds=5)

    assert (await h.snapshot(KEY)).cooldown_until == until


async def test_entries_are_independent(world: World) -> None:
    await world.health.record_failure("entry:1", "auth")

    assert not await world.health.available("entry:1")
    assert await world.health.available("entry:2")


async def test_concurrent_callers_get_exactly_one_probe(world: World) -> None:
    await world.health.record_failure(KEY, "auth")
    world.clock.advance(600)

    answers = await asyncio.gather(*(world.health.available(KEY) for _ in range(25)))

    assert answers.count(True) == 1


# --- Redis specifics ---------------------------------------------------------------------------------


async def test_every_redis_key_expires(redis_client: redis.asyncio.Redis, prefix: str) -> None:
    health = RedisEntryHealth(redis_client, prefix=prefix, clock=SystemClock())
    try:
        await health.record_failure(KEY, "auth")
        await health.record_success("entry:ok")

        keys = [key async for key in redis_client.scan_iter(match=f"{prefix}:*")]
        assert {k.decode() for k in keys} >= {f"{prefix}:{KEY}:s", f"{prefix}:{KEY}:c", f"{prefix}:{KEY}:f"}
        for key in keys:
            ttl = await redis_client.ttl(key)
            assert 0 < ttl <= 600 + 3600, key
    finally:
        await _drop_prefix(redis_client, prefix)


async def test_a_second_process_sees_the_cooldown(redis_client: redis.asyncio.Redis, prefix: str) -> None:
    """Two real processes share one breaker: the parent opens it, a child sees it (and its own
    failure is seen back by the parent)."""
    parent = RedisEntryHealth(redis_client, prefix=prefix, clock=SystemClock())
    child_code = textwrap.dedent(
        f"""
        import asyncio, json
        import redis.asyncio
        from llm.health import RedisEntryHealth

        async def main():
            client = redis.asyncio.Redis(host={REDIS_HOST!r}, port={REDIS_PORT})
            health = RedisEntryHealth(client, prefix={prefix!r})
            snap = await health.snapshot({KEY!r})
            seen = {{"available": await health.available({KEY!r}), "state": snap.state,
                     "cooldown_until": snap.cooldown_until, "last_error_class": snap.last_error_class}}
            await health.record_failure("entry:from-child", "auth")
            await client.aclose()
            print(json.dumps(seen))

        asyncio.run(main())
        """
    )
    try:
        await parent.record_failure(KEY, "quota_exhausted")
        until = (await parent.snapshot(KEY)).cooldown_until

        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", child_code],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen == {"available": False, "state": "open", "cooldown_until": pytest.approx(until, abs=1e-3),
                        "last_error_class": "quota_exhausted"}
        assert not await parent.available("entry:from-child")
    finally:
        await _drop_prefix(redis_client, prefix)


async def test_two_clients_race_for_one_probe(prefix: str) -> None:
    clock = FakeClock()
    clients = [redis.asyncio.Redis(host=REDIS_HOST, port=REDIS_PORT) for _ in range(4)]
    healths = [RedisEntryHealth(c, prefix=prefix, clock=clock) for c in clients]
    try:
        await healths[0].record_failure(KEY, "auth")
        clock.advance(600)

        answers = await asyncio.gather(*(h.available(KEY) for h in healths for _ in range(10)))

        assert answers.count(True) == 1
    finally:
        await _drop_prefix(clients[0], prefix)
        for client in clients:
            await client.aclose()


async def test_an_unreachable_redis_raises_health_state_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = redis.asyncio.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    health = RedisEntryHealth(client, prefix="test:unreachable")
    try:
        with pytest.raises(HealthStateUnavailable):
            await health.available(KEY)
        with pytest.raises(HealthStateUnavailable):
            await health.record_failure(KEY, "server")
    finally:
        await client.aclose()


async def test_pipelined_a_failing_script_raises_health_state_unavailable_and_the_next_call_works(
    redis_client: redis.asyncio.Redis, prefix: str
) -> None:
    """Through the loop's pipelined connection: a script error fails that call only."""
    from sessions.events import pipelined_command, publisher_aclose

    health = RedisEntryHealth(redis_client, prefix=prefix, execute=pipelined_command)
    try:
        with pytest.raises(HealthStateUnavailable, match="unknown op"):
            await health._run("no-such-op", KEY)
        assert await health.available(KEY) is True
        await health.record_success(KEY)
        assert (await health.snapshot(KEY)).calls_last_minute == 1
    finally:
        await publisher_aclose()
        await _drop_prefix(redis_client, prefix)


async def test_pipelined_an_unreachable_redis_raises_health_state_unavailable(settings) -> None:
    from sessions.events import pipelined_command, publisher_aclose

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    health = RedisEntryHealth(redis.asyncio.Redis(port=port), prefix="test:unreachable", execute=pipelined_command)
    try:
        with pytest.raises(HealthStateUnavailable):
            await health.available(KEY)
    finally:
        await publisher_aclose()


def test_a_prefix_is_required() -> None:
    with pytest.raises(ValueError):
        RedisEntryHealth(redis.asyncio.Redis(), prefix="")
