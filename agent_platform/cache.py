"""The cache backend: Django's Redis cache, with each connection pool's ``redis.Redis`` client
made once instead of at every cache call.

Django's ``RedisCacheClient.get_client`` builds a new ``redis.Redis`` around the pool for
each ``get``/``set`` (Django 5.2), and each one copies redis-py's ~170 response callbacks into a
case-insensitive dict: eight of them per message posted (the four throttles' ``get`` and
``set``), about a tenth of a millisecond each. A ``redis.Redis`` is safe to share between
threads (every command takes a connection from the pool), so one per pool is kept.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient


class SharedClientRedisCacheClient(RedisCacheClient):
    """:class:`RedisCacheClient` whose ``get_client`` returns one ``redis.Redis`` per pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        """The shared client of the pool Django picks for ``write`` (made on first use)."""
        index = self._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            client = self._clients[index] = self._client(connection_pool=self._get_connection_pool(write))
        return client


class SharedClientRedisCache(RedisCache):
    """``CACHES["default"]["BACKEND"]``: Django's Redis cache over :class:`SharedClientRedisCacheClient`."""

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedClientRedisCacheClient
