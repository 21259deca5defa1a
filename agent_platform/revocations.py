"""Telling open event streams at once that an API token was revoked.

:func:`token_revoked_publish` (called by :func:`tenants.services.api_token_revoke` once the
revocation commits) publishes ``{"token_id": N}`` (msgpack) on the Redis channel
:func:`revocations_channel`; every web process's live subscription (:mod:`sessions.live`)
hands it to the streams opened with that token, which close at once (WebSocket 4401, SSE
``stream_closed``). A lost message only delays the close to the streams' periodic credential
check (:data:`sessions.stream_guard.AUTH_RECHECK_SECONDS`). A module of its own so that
``tenants`` does not import ``sessions``.
"""

from __future__ import annotations

import logging

import msgpack
import redis
from django.conf import settings

logger = logging.getLogger(__name__)

_client: redis.Redis | None = None


def revocations_channel() -> str:
    """The Redis pub/sub channel of revoked tokens (under ``REDIS_KEY_PREFIX``)."""
    return f"{settings.REDIS_KEY_PREFIX}:streams:revoked"


def token_revoked_publish(*, token_id: int) -> None:
    """Publish that token ``token_id`` was revoked. Never raises: Redis being down is logged
    (the streams still close at their next credential check)."""
    global _client
    try:
        if _client is None:
            _client = redis.Redis.from_url(settings.REDIS_URL)
        _client.publish(revocations_channel(), msgpack.packb({"token_id": token_id}))
    except redis.RedisError as exc:
        logger.warning("could not announce the revocation of token %s (%r); open streams close at "
                       "their next credential check", token_id, exc)
