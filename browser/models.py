"""Paired browsers (devices) and the pairing requests that create them.

A device token is like a tenants.ApiToken but narrower: it only authenticates the extension's
WebSocket ``/ws/browser/`` for one user in one tenant. Only its SHA-256 is stored.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.scoping import TenantOwnedModel


class BrowserDevice(TenantOwnedModel):
    """A paired browser (the Chrome extension) of one user in one tenant."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="browser_devices")
    name = models.CharField(max_length=100, blank=True, help_text="Shown in device lists, e.g. 'Chrome on laptop'.")
    token_prefix = models.CharField(max_length=16, help_text="First characters of the token, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True)
    extension_version = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name or 'browser'} ({self.token_prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class BrowserPairing(models.Model):
    """A pairing request started by the extension (no tenant until a user approves its code).

    Not tenant-owned: before approval it belongs to nobody. Its ``code`` (shown by the
    extension, typed into the SPA) and ``poll_secret`` (kept by the extension) are stored as
    SHA-256 hashes; it expires ``BROWSER_PAIRING_TTL_SECONDS`` after creation and issues at
    most one device token.
    """

    code_hash = models.CharField(max_length=64, unique=True)
    poll_secret_hash = models.CharField(max_length=64)
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    approved_at = models.DateTimeField(null=True, blank=True)
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    device = models.OneToOneField(BrowserDevice, null=True, blank=True, on_delete=models.SET_NULL, related_name="pairing")
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"pairing {self.pk} ({'approved' if self.approved_at else 'pending'})"
