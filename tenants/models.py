"""Tenants, memberships and API tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.scoping import TenantOwnedModel


class Tenant(models.Model):
    """An organisation: owns agents, providers, capabilities, sessions and runs."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    wrapped_data_key = models.TextField(editable=False, help_text="Data key wrapped by the master key.")
    monthly_budget_usd = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True,
        help_text="Budget: USD of model usage per calendar month (UTC); blank: no limit.",
    )
    max_concurrent_runs = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Runs of this tenant working at once; more wait queued. Blank: the RUNS_PER_TENANT_DEFAULT setting.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"


ADMIN_ROLES = frozenset({Role.OWNER, Role.ADMIN})


class Membership(TenantOwnedModel):
    """A user's place in a tenant. Owners and admins configure; members chat."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant_id} ({self.role})"

    @property
    def is_admin(self) -> bool:
        return self.role in ADMIN_ROLES


class ApiToken(TenantOwnedModel):
    """A bearer token bound to one membership. Only its SHA-256 is stored; shown once."""

    membership = models.ForeignKey(Membership, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise a token in lists.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'token'})"
