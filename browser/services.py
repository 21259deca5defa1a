"""Writes of the browser app: pairing, device tokens, revocation.

Pairing flow (all three steps are services here; the API only parses and renders):
1. :func:`browser_pairing_create` (extension, unauthenticated) → code + pairing id + poll secret.
2. :func:`browser_pairing_approve` (a logged-in user types the code in the SPA) → binds the
   pairing to that user and their current tenant.
3. :func:`browser_pairing_claim` (extension polls with the secret) → the device token, once.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import Throttled

from agent_platform.api_errors import NotFound
from agent_platform.redis_clients import sync_redis
from browser.models import BrowserDevice, BrowserPairing
from tenants.audit import Action, audit_record
from tenants.scoping import tenant_scope

DEVICE_TOKEN_PREFIX = "apd_"
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
"""No 0/O, 1/I: codes are read off a screen and typed by hand."""
CODE_LENGTH = 8
"""32⁸ ≈ 10¹² codes; with a 10-minute life and rate-limited approvals, not guessable."""


def sha256_hex(raw: str) -> str:
    """Hex SHA-256 of ``raw`` (UTF-8): how codes, poll secrets and device tokens are stored."""
    return hashlib.sha256(raw.encode()).hexdigest()


def code_normalize(code: str) -> str:
    """``"abcd-efgh "`` → ``"ABCDEFGH"`` (case, spaces and dashes do not matter)."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def device_group(device_id: int) -> str:
    """Channels group of one device's sockets (for revocation)."""
    return f"browser.device.{device_id}"


@dataclass(frozen=True)
class IssuedPairing:
    pairing: BrowserPairing
    code: str
    """``ABCD-EFGH``: shown by the extension, typed by the user."""
    poll_secret: str
    """Kept by the extension; proves it started this pairing when it claims the token."""


def browser_pairing_create(*, name: str = "") -> IssuedPairing:
    """Start a pairing: a fresh code and poll secret (only their hashes are stored)."""
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    poll_secret = secrets.token_urlsafe(32)
    pairing = BrowserPairing.objects.create(
        code_hash=sha256_hex(raw), poll_secret_hash=sha256_hex(poll_secret), name=name[:100],
        expires_at=timezone.now() + timedelta(seconds=settings.BROWSER_PAIRING_TTL_SECONDS),
    )
    return IssuedPairing(pairing=pairing, code=f"{raw[:4]}-{raw[4:]}", poll_secret=poll_secret)


@transaction.atomic
def browser_pairing_approve(*, code: str, user, tenant) -> BrowserPairing:
    """Bind the pending pairing with ``code`` to ``user`` in ``tenant``.

    Raises:
        NotFound: no pending, unexpired pairing has this code (also: already approved).
    """
    pairing = (
        BrowserPairing.objects.select_for_update()
        .filter(code_hash=sha256_hex(code_normalize(code)), approved_at__isnull=True, expires_at__gt=timezone.now())
        .first()
    )
    if pairing is None:
        raise NotFound("No pending pairing has this code; it may have expired. Start pairing again in the extension.")
    pairing.approved_at = timezone.now()
    pairing.tenant = tenant
    pairing.user = user
    pairing.save(update_fields=["approved_at", "tenant", "user"])
    audit_record(action=Action.DEVICE_PAIRING_APPROVED, obj=pairing, tenant_id=tenant.pk,
                 object_repr=f"pairing {pairing.pk} ({pairing.name or 'Chrome'})")
    return pairing


@dataclass(frozen=True)
class ClaimResult:
    status: str
    """``pending`` (not approved yet), ``approved`` (token issued now)."""
    device: BrowserDevice | None = None
    token: str | None = None
    """The raw device token ``apd_…`` (only in the ``approved`` answer; never again)."""


@transaction.atomic
def browser_pairing_claim(*, pairing_id: int, poll_secret: str) -> ClaimResult:
    """The extension's poll: ``pending`` until approved, then the device token exactly once.

    Raises:
        NotFound: unknown pairing, wrong secret, expired, or its token was already issued
            (one message for all: the caller cannot tell them apart).
    """
    gone = NotFound("Pairing not found, expired or already used. Start pairing again.")
    pairing = BrowserPairing.objects.select_for_update().filter(pk=pairing_id).first()
    if pairing is None or not secrets.compare_digest(pairing.poll_secret_hash, sha256_hex(poll_secret)):
        raise gone
    if pairing.claimed_at is not None:
        raise gone
    if pairing.approved_at is None:
        if pairing.expires_at <= timezone.now():
            raise gone
        return ClaimResult(status="pending")
    raw = DEVICE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with tenant_scope(pairing.tenant_id):  # the approved pairing decides the tenant
        device = BrowserDevice.objects.create(
            tenant=pairing.tenant, user_id=pairing.user_id, name=pairing.name or "Chrome",  # the answer names the tenant
            token_prefix=raw[:10], token_hash=sha256_hex(raw),
        )
    pairing.device = device
    pairing.claimed_at = timezone.now()
    pairing.save(update_fields=["device", "claimed_at"])
    audit_record(action=Action.DEVICE_PAIRED, obj=device, actor=pairing.user,
                 detail={"pairing_id": pairing.pk, "token_prefix": device.token_prefix})
    return ClaimResult(status="approved", device=device, token=raw)


def browser_device_revoke(*, device: BrowserDevice) -> BrowserDevice:
    """Revoke ``device``: its token is refused from now on and its open sockets are closed.

    Idempotent. The close reaches the consumer through the channel layer after commit.
    """
    if device.revoked_at is None:
        device.revoked_at = timezone.now()
        device.save(update_fields=["revoked_at"])
        audit_record(action=Action.DEVICE_REVOKED, obj=device)
    device_id = device.pk
    transaction.on_commit(lambda: async_to_sync(get_channel_layer().group_send)(
        device_group(device_id), {"type": "browser.revoked"}
    ))
    return device


def browser_device_seen(*, device_id: int, extension_version: str = "") -> None:
    """Touch ``last_seen_at`` (and the extension version) of a device on connect."""
    fields = {"last_seen_at": timezone.now()}
    if extension_version:
        fields["extension_version"] = extension_version[:32]
    # tenant-bypass: the consumer authenticated this device by its token hash.
    BrowserDevice.all_tenants.filter(pk=device_id).update(**fields)


RATE_LIMITED_MESSAGE = "Too many requests; try again in a few minutes."


def _rate_key(key: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:browser:rl:{key}"


def _throttled(client, full: str, window_seconds: int) -> Throttled:
    ttl = client.ttl(full)
    return Throttled(wait=ttl if isinstance(ttl, int) and ttl > 0 else window_seconds, detail=RATE_LIMITED_MESSAGE)


def rate_limit_hit(*, key: str, limit: int, window_seconds: int) -> None:
    """Count one hit on ``key``; raise 429 past ``limit`` hits within ``window_seconds``.

    Redis INCR + EXPIRE (fixed window). Used for the pairing endpoints.

    Raises:
        rest_framework.exceptions.Throttled: 429 with ``Retry-After`` (the window's rest).
    """
    full = _rate_key(key)
    client = sync_redis()
    count = client.incr(full)
    if count == 1:
        client.expire(full, window_seconds)
    if count > limit:
        raise _throttled(client, full, window_seconds)


def rate_limit_check(*, key: str, limit: int, window_seconds: int) -> None:
    """Raise 429 if ``key`` already has ``limit`` hits in its window (counts nothing): for
    limits on failures only, checked before the attempt and hit after a failure.

    Raises:
        rest_framework.exceptions.Throttled: 429 with ``Retry-After``.
    """
    full = _rate_key(key)
    client = sync_redis()
    count = client.get(full)
    if count is not None and int(count) >= limit:
        raise _throttled(client, full, window_seconds)
