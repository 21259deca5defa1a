"""Telling open event streams at once that their credential is gone: an API token revoked, a
login session ended.

:func:`token_revoked_publish` (called by :func:`tenants.services.api_token_revoke` once the
revocation commits) publishes ``{"token_id": N}`` (msgpack) on the Redis channel
:func:`revocations_channel`; :func:`session_ended_publish` (a sign-out, or the single sign-on
provider's back-channel logout) publishes ``{"session": <digest>}``, the login session key's
:func:`session_key_digest`, never the key itself (a cookie's value). Every web process's live
subscription (:mod:`sessions.live`) hands them to the streams opened with that token or on
that session's cookie, which close at once (WebSocket 4401, SSE ``stream_closed``). A lost
message only delays the close to the streams' periodic credential check
(:data:`sessions.stream_guard.AUTH_RECHECK_SECONDS`). A module of its own so that ``tenants``
does not import ``sessions``.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgpack
import redis
from django.conf import settings

logger = logging.getLogger(__name__)

_client: redis.Redis | None = None


def revocations_channel() -> str:
    """The Redis pub/sub channel of revoked tokens (under ``REDIS_KEY_PREFIX``)."""
    return f"{settings.REDIS_KEY_PREFIX}:streams:revoked"


def session_key_digest(session_key: str) -> str:
    """The name of a login session on the revocations channel: the SHA-256 of its key, 32 hex
    digits (the key is a bearer secret; Redis subscribers see only this)."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:32]


def _publish(message: dict[str, Any], what: str) -> None:
    global _client
    try:
        if _client is None:
            _client = redis.Redis.from_url(settings.REDIS_URL)
        _client.publish(revocations_channel(), msgpack.packb(message))
    except redis.RedisError as exc:
        logger.warning("could not announce the end of %s (%r); open streams close at their next credential "
                       "check", what, exc)


def token_revoked_publish(*, token_id: int) -> None:
    """Publish that token ``token_id`` was revoked. Never raises: Redis being down is logged
    (the streams still close at their next credential check)."""
    _publish({"token_id": token_id}, f"token {token_id}")


def session_ended_publish(*, session_key: str) -> None:
    """Publish that login session ``session_key`` ended (signed out, or ended by the single
    sign-on provider). Never raises, as :func:`token_revoked_publish`."""
    _publish({"session": session_key_digest(session_key)}, "a login session")


def session_signed_out(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """``user_logged_out``: the streams on the signing-out session's cookie close at once."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        session_ended_publish(session_key=session_key)
