"""What every session event stream (WebSocket ``/ws/sessions/<id>/``, SSE
``/api/v1/sessions/<id>/events``) checks besides the first authentication.

- **Credentials stay valid.** A stream remembers what it was opened with
  (:class:`StreamCredential`: an API token, or a login session cookie) and re-checks it every
  :data:`AUTH_RECHECK_SECONDS` (:func:`credential_valid`; the re-checks of a web process's
  streams asked for within :data:`CREDENTIAL_BATCH_SECONDS` share one query per kind); a
  revoked token, a deleted membership, a deactivated user or a logged-out/expired login
  session ends the stream (WebSocket close 4401; SSE: an ``event: stream_closed`` then the
  end of the response).
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
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Final

from channels.db import database_sync_to_async
from django.conf import settings

from agent_platform.loop_batch import LoopBatch
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
    return credentials_valid_sync([credential])[0]


CHECK_CHUNK: Final[int] = 1000
"""Most ids one query of :func:`credentials_valid_sync` names (``pk IN (…)``)."""


def credentials_valid_sync(credentials: Sequence[StreamCredential]) -> list[bool]:
    """:func:`credential_valid_sync` of each credential, in order, in one query per kind for
    all of them: the memberships (with their users' ``is_active``), the API tokens, the OAuth
    grants (each in chunks of :data:`CHECK_CHUNK` ids). A login-session credential also loads
    its session (``SESSION_ENGINE``), one at a time. A credential given twice is checked once.

    Raises what the database raises (the callers end their streams' iterations with it)."""
    from tenants.models import ApiToken, Membership
    from tenants.scoping import system_scope

    distinct = list(dict.fromkeys(credentials))

    def rows(model: Any, ids: set[int], *fields: str, **filters: Any) -> set[tuple[Any, ...]]:
        ordered, found = sorted(ids), set()
        for start in range(0, len(ordered), CHECK_CHUNK):
            found.update(model.all_tenants.filter(pk__in=ordered[start:start + CHECK_CHUNK], **filters)
                         .values_list("pk", *fields))
        return found

    # tenant-bypass: re-checks the callers' own credentials, as authentication does.
    with system_scope():
        members = rows(Membership, {c.membership_id for c in distinct}, "user_id", user__is_active=True)
        token_ids = {c.token_id for c in distinct if c.token_id is not None}
        tokens = rows(ApiToken, token_ids, "membership_id", revoked_at__isnull=True) if token_ids else set()
        grant_ids = {c.oauth_grant_id for c in distinct if c.token_id is None and c.oauth_grant_id is not None}
        grants: set[tuple[Any, ...]] = set()
        if grant_ids:
            from oauth_server.models import McpGrant

            grants = rows(McpGrant, grant_ids, "membership_id")
    valid: dict[StreamCredential, bool] = {}
    for credential in distinct:
        if (credential.membership_id, credential.user_id) not in members:
            valid[credential] = False
        elif credential.token_id is not None:
            valid[credential] = (credential.token_id, credential.membership_id) in tokens
        elif credential.oauth_grant_id is not None:
            valid[credential] = (credential.oauth_grant_id, credential.membership_id) in grants
        else:
            valid[credential] = _login_session_valid(credential)
    return [valid[credential] for credential in credentials]


def _login_session_valid(credential: StreamCredential) -> bool:
    if not credential.session_key:
        return False
    from importlib import import_module

    from django.contrib.auth import get_user

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=credential.session_key)
    user = get_user(SimpleNamespace(session=store))
    return bool(user.is_authenticated and user.pk == credential.user_id)


CREDENTIAL_BATCH_SECONDS: float = 1.0
"""How long a stream's re-check waits for the re-checks of the process's other streams, so that
one set of queries answers them all (:func:`credential_valid`). A credential that stopped
authenticating ends its streams within ``AUTH_RECHECK_SECONDS`` + this (+ the queries)."""


async def _credentials_valid(credentials: list[StreamCredential]) -> list[bool]:
    # On a thread of the loop's pool (a batch belongs to no request's thread).
    return await database_sync_to_async(credentials_valid_sync, thread_sensitive=False)(credentials)


_credential_checks: LoopBatch[StreamCredential, bool] = LoopBatch(
    _credentials_valid, lambda: CREDENTIAL_BATCH_SECONDS)
"""The re-checks of each event loop's streams, answered together. One by one, each was a thread
hop and two ORM queries; in a scale-out round they were 16 % of a web process's CPU
(bench/README.md, "Credential re-checks together")."""


async def credential_valid(credential: StreamCredential) -> bool:
    """Async :func:`credential_valid_sync`, answered together with the other re-checks of this
    event loop's streams asked for within :data:`CREDENTIAL_BATCH_SECONDS` (so it returns
    that much later; :class:`agent_platform.loop_batch.LoopBatch`). Raises what the queries raise."""
    return await _credential_checks.ask(credential)


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
