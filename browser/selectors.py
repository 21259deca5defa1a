"""Reads of the browser app."""

from __future__ import annotations

from django.db.models import QuerySet

from browser.models import BrowserDevice
from browser.services import sha256_hex
from tenants.scoping import system_scope


def browser_device_authenticate(*, raw: str) -> BrowserDevice | None:
    """The live device for the raw token ``apd_…``, or None (unknown, revoked, user inactive).

    Needs no tenant scope: the token decides the tenant.
    """
    if not raw or len(raw) > 200:
        return None
    # tenant-bypass: the token decides the tenant.
    with system_scope():
        device = (
            BrowserDevice.all_tenants.select_related("user", "tenant")
            .filter(token_hash=sha256_hex(raw), revoked_at__isnull=True)
            .first()
        )
    if device is None or not device.user.is_active:
        return None
    return device


def browser_device_list(*, user_id: int) -> QuerySet[BrowserDevice]:
    """The user's devices in the current tenant (needs tenant scope), newest first, revoked included."""
    return BrowserDevice.objects.filter(user_id=user_id).order_by("-created_at")


def browser_device_get(*, user_id: int, device_id: int) -> BrowserDevice | None:
    """One of the user's devices in the current tenant, or None (missing, another user's or tenant's)."""
    return BrowserDevice.objects.filter(user_id=user_id, pk=device_id).first()
