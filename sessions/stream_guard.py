"""What every session event stream (WebSocket ``/ws/sessions/<id>/``, SSE
``/api/v1/sessions/<id>/events``) checks besides the first authentication.

- **Credentials stay valid.** A stream remembers what it was opened with
  (:class:`StreamCredential`: an API token, or a login session cookie) and re-checks it every
  :data:`AUTH_RECHECK_SECONDS` (:func:`credential_valid`); a revoked token, a deleted
  membership, a deactivated user or a logged-out/expired login session ends the stream
  (WebSocket close 4401; SSE: an ``event: stream_closed`` then the end of the response).
- **A cap on open streams per user.** :func:`stream_slot_acquire` leases one of
  ``settings.STREAMS_PER_USER_MAX`` (default 20) slots, counted across WebSocket and SSE and
  across web processes in one Redis sorted set per user
  (``<REDIS_KEY_PREFIX>:streams:user:<id>``: member = a random slot id, score = lease
  expiry). A stream renews its lease at every ping (:func:`stream_slot_renew`) and frees it
  when it ends (:func:`stream_slot_release`); a slot of a process that died expires after
  :data:`STREAM_LEASE_SECONDS`. Over the cap: SSE 429 ``{message, extra}`` with
  ``Retry-After``, WebSocket close 4429.
- **Valid resume points.** :func:`parse_after_seq`: ``after_seq``/``Last-Event-ID`` must be
  an integer in 0..2**63-1 (SSE 400, WebSocket close 4400 otherwise).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Final

from channels.db import database_sync_to_async
from django.conf import settings

from agent_platform.redis_clients import async_redis

AUTH_RECHECK_SECONDS: float = 15.0
"""How often an open stream re-checks its credential: the longest a revoked token's stream
stays open (the same as the ping interval)."""
STREAM_LEASE_SECONDS: Final[float] = 45.0
"""A stream slot not renewed for this long is free again (three ping intervals)."""
MAX_SEQ: Final[int] = 2**63 - 1
"""Largest ``after_seq`` / ``Last-Event-ID`` accepted."""


def streams_per_user_max() -> int:
    """``settings.STREAMS_PER_USER_MAX`` (default 20): open event streams per user."""
    return int(getattr(settings, "STREAMS_PER_USER_MAX", 20))


class InvalidAfterSeq(ValueError):
    """``after_seq`` / ``Last-Event-ID`` is not an integer in 0..2**63-1."""


def parse_after_seq(raw: str | None) -> int:
    """The resume point a client sent: None or ``""`` → 0, else a decimal integer in
    0..:data:`MAX_SEQ` (at most 19 digits).

    Raises:
        InvalidAfterSeq: anything else (negative, 30 digits, not a number).
    """
    if raw is None or raw.strip() == "":
        return 0
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_SEQ:
        raise InvalidAfterSeq("after_seq must be an integer from 0 to 9223372036854775807.")
    return int(raw)


@dataclass(frozen=True)
class StreamCredential:
    """What a stream was opened with.

    Attributes:
        user_id: The caller.
        membership_id: The membership the stream is scoped by.
        token_id: The API token's id; None for a session-cookie stream.
        oauth_grant_id: The OAuth grant's id (``oauth_server.McpGrant``) for a stream opened
            with an OAuth access token (an MCP client); None otherwise.
        session_key: The login session's key (cookie streams); None for a token stream.
    """

    user_id: int
    membership_id: int
    token_id: int | None = None
    session_key: str | None = None
    oauth_grant_id: int | None = None


def credential_valid_sync(credential: StreamCredential) -> bool:
    """Whether ``credential`` would still authenticate: the token unrevoked (or the OAuth grant
    not revoked, or the login session still logged in as the same user, its password unchanged),
    the membership still there, the user active. One or two queries; no tenant scope needed."""
    from django.contrib.auth import get_user

    from tenants.models import ApiToken, Membership
    from tenants.scoping import system_scope

    # tenant-bypass: re-checks the caller's own credential, as authentication does.
    with system_scope():
        if not Membership.all_tenants.filter(pk=credential.membership_id, user_id=credential.user_id,
                                             user__is_active=True).exists():
            return False
        if credential.token_id is not None:
            return ApiToken.all_tenants.filter(pk=credential.token_id, membership_id=credential.membership_id,
                                               revoked_at__isnull=True).exists()
        if credential.oauth_grant_id is not None:
            from oauth_server.models import McpGrant

            return McpGrant.all_tenants.filter(pk=credential.oauth_grant_id,
                                               membership_id=credential.membership_id).exists()
    if not credential.session_key:
        return False
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=credential.session_key)
    user = get_user(SimpleNamespace(session=store))
    return bool(user.is_authenticated and user.pk == credential.user_id)


credential_valid = database_sync_to_async(credential_valid_sync)
"""Async :func:`credential_valid_sync`."""


_ACQUIRE_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def _slots_key(user_id: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:streams:user:{user_id}"


async def stream_slot_acquire(*, user_id: int) -> str | None:
    """Lease one of the user's stream slots.

    Returns:
        The slot id (pass it to renew/release), or None when the user already holds
        :func:`streams_per_user_max` live slots.
    """
    slot = secrets.token_hex(8)
    now = time.time()
    ttl = int(STREAM_LEASE_SECONDS) + 1
    granted = await async_redis().eval(_ACQUIRE_LUA, 1, _slots_key(user_id), now, now + STREAM_LEASE_SECONDS,
                                       streams_per_user_max(), slot, ttl)
    return slot if int(granted) == 1 else None


async def stream_slot_renew(*, user_id: int, slot: str) -> None:
    """Extend the lease of ``slot`` by :data:`STREAM_LEASE_SECONDS` from now."""
    key = _slots_key(user_id)
    client = async_redis()
    await client.zadd(key, {slot: time.time() + STREAM_LEASE_SECONDS})
    await client.expire(key, int(STREAM_LEASE_SECONDS) + 1)


async def stream_slot_release(*, user_id: int, slot: str) -> None:
    """Free ``slot`` (nothing if it expired already)."""
    await async_redis().zrem(_slots_key(user_id), slot)
