"""The cache backend (agent_platform/cache.py): Django's Redis cache with one ``redis.Redis``
client per connection pool instead of a new one at every call."""

from __future__ import annotations

import threading

from django.core.cache import cache

from agent_platform.cache import SharedClientRedisCacheClient


def test_every_call_shares_the_pools_client():
    client = cache._cache  # the backend's client, made on first use
    assert isinstance(client, SharedClientRedisCacheClient)
    assert client.get_client(write=True) is client.get_client(write=True)
    assert client.get_client("some-key") is client.get_client("another-key")


def test_the_cache_reads_and_writes_through_it_from_several_threads():
    errors = []

    def work(n: int) -> None:
        try:
            for i in range(50):
                cache.set(f"shared-client:{n}:{i}", i, 30)
                assert cache.get(f"shared-client:{n}:{i}") == i
            assert cache.incr(f"shared-client:{n}:0", 5) == 5
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    cache.delete_many([f"shared-client:{n}:{i}" for n in range(4) for i in range(50)])
