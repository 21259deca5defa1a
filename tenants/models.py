"""Tenants, memberships, invitations, API tokens and the audit log."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwnedModel

LLM_BODY_RETENTION_DEFAULT_DAYS = 7
"""Days a tenant's model call records (request and response bodies) are kept unless it sets its own."""
LLM_BODY_RETENTION_MIN_DAYS = 1
LLM_BODY_RETENTION_MAX_DAYS = 90
"""Bounds of ``Tenant.llm_body_retention_days``: bodies hold whole conversations, so they are
not kept for longer than a quarter."""


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
    trace_content = models.BooleanField(
        default=False,
        help_text="Traces: export message content (the run's input and answer, tool call arguments and results) "
                  "on this tenant's spans. Off: spans carry names, models, tokens, timings and outcomes only.",
    )
    record_llm_bodies = models.BooleanField(
        default=False, db_default=False,
        help_text="Model call records: keep the exact request and response bodies of this tenant's model calls "
                  "(shown to its admins in the console's run trace; provider keys are never kept). Off: calls "
                  "keep tokens, timings and outcomes only, and the bodies kept so far are deleted within the hour.",
    )
    llm_body_retention_days = models.PositiveSmallIntegerField(
        default=LLM_BODY_RETENTION_DEFAULT_DAYS, db_default=LLM_BODY_RETENTION_DEFAULT_DAYS,
        validators=[MinValueValidator(LLM_BODY_RETENTION_MIN_DAYS), MaxValueValidator(LLM_BODY_RETENTION_MAX_DAYS)],
        help_text=f"Model call records are deleted this many days after the call "
                  f"({LLM_BODY_RETENTION_MIN_DAYS}–{LLM_BODY_RETENTION_MAX_DAYS}).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(llm_body_retention_days__gte=LLM_BODY_RETENTION_MIN_DAYS,
                                   llm_body_retention_days__lte=LLM_BODY_RETENTION_MAX_DAYS),
                name="tenant_llm_body_retention_days_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"


ADMIN_ROLES = frozenset({Role.OWNER, Role.ADMIN})


class Membership(TenantOwnedModel):
    """A user's place in a tenant. Owners and admins configure; members chat.

    A membership's user and tenant never change once it exists (:meth:`save` and
    :meth:`clean` refuse it): its API tokens authenticate as that user in that tenant, so
    re-pointing it would hand them to someone else. Another user joins a tenant through an
    :class:`Invitation`; a member leaves by having the membership deleted.

    ``last_selected_at`` is when the user last picked this tenant (``X-Tenant``, or
    ``POST /api/v1/auth/tenant/``); the user's default tenant is the most recently picked
    one, else the oldest membership (:func:`tenants.selectors.membership_for_user`).
    """

    IMMUTABLE_FIELDS = ("user_id", "tenant_id")

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)
    last_selected_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="When the user last picked this tenant; the most recent one is their default.",
    )

    class Meta(TenantOwnedModel.Meta):
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")]
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant_id} ({self.role})"

    @classmethod
    def from_db(cls, db: Any, field_names: Any, values: Any) -> Membership:
        instance = super().from_db(db, field_names, values)
        # what was loaded (a deferred field is absent and never compared)
        instance._stored_identity = {name: instance.__dict__[name] for name in cls.IMMUTABLE_FIELDS
                                     if name in instance.__dict__}
        return instance

    def _moved_fields(self) -> list[str]:
        """The immutable fields that differ from the stored row (empty for a new row)."""
        if self.pk is None:
            return []
        stored = getattr(self, "_stored_identity", None)
        if stored is None:  # an instance not loaded from the database: ask it
            row = Membership.all_tenants.filter(pk=self.pk).values(*self.IMMUTABLE_FIELDS).first()
            if row is None:
                return []
            stored = row
        return [name[:-3] for name, old in stored.items()
                if name in self.__dict__ and self.__dict__[name] != old]

    def clean(self) -> None:
        super().clean()
        moved = self._moved_fields()
        if moved:
            raise ValidationError(dict.fromkeys(moved, "A membership's user and tenant cannot change."))

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save; refuses (ValidationError) to change the user or tenant of an existing row."""
        moved = self._moved_fields()
        if moved:
            raise ValidationError(dict.fromkeys(moved, "A membership's user and tenant cannot change."))
        super().save(*args, **kwargs)
        self._stored_identity = {name: self.__dict__[name] for name in self.IMMUTABLE_FIELDS if name in self.__dict__}

    @property
    def is_admin(self) -> bool:
        return self.role in ADMIN_ROLES


class Invitation(TenantOwnedModel):
    """An invitation for one user (by username or e-mail) to join the tenant with ``role``.

    Created by a tenant owner/admin; the raw token is shown once and only its SHA-256 is
    stored. The invited user, logged in, accepts it with the token
    (``POST /api/v1/invitations/accept/``), which creates their membership. Valid until
    ``expires_at`` and only once; ``revoked_at`` withdraws it.
    """

    username = models.CharField(max_length=150, blank=True, help_text="The invited user's username, or blank.")
    email = models.EmailField(blank=True, help_text="The invited user's e-mail address, or blank.")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False, help_text="First characters of the token.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True, editable=False)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False,
    )
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(username="", email=""), name="invitation_names_a_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.username or self.email} as {self.role} ({self.prefix}…)"

    @property
    def state(self) -> str:
        """``pending``, ``accepted``, ``revoked`` or ``expired``."""
        if self.accepted_at is not None:
            return "accepted"
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "pending"


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


class AuditEvent(TenantOwnedModel):
    """One admin write or security event: who did what to which object, when, from where.

    Written only by :func:`tenants.audit.audit_record`. Append-only: the console and API are
    read-only, and the database refuses ``UPDATE`` and ``DELETE`` of a row to the application's
    role (revoked, and a trigger: :data:`tenants.rls.APPEND_ONLY_MODELS`). So deleting a user
    or a tenant leaves its events as they were: ``actor`` and ``tenant`` keep the deleted
    row's id (no foreign key constraint; ``actor_repr`` keeps the name). ``tenant`` is null for events that
    belong to no tenant (a failed login for an unknown username, a superuser's change to a
    platform-wide object): under row-level security such rows are visible in the system
    scope only, i.e. to superusers.

    ``changes`` maps field names to ``{"from": …, "to": …}`` (strings, at most 200 chars
    each), or to ``{"changed": true}`` for secret fields (API keys, env, headers, passwords,
    tokens), whose values are never recorded. ``detail`` holds the event's context (e.g.
    the attempted username of a failed login, the role of an invitation).
    """

    # DO_NOTHING without a database constraint: deleting the user or tenant must not UPDATE an
    # event (refused: the log is append-only), and the event keeps whose it was.
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.DO_NOTHING,
                               db_constraint=False, related_name="+")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=64, db_index=True)
    source = models.CharField(max_length=16, help_text="console, api, auth or system.")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.DO_NOTHING,
                              db_constraint=False, related_name="+")
    actor_repr = models.CharField(max_length=150, blank=True, help_text="The actor's username when it acted.")
    object_type = models.CharField(max_length=100, blank=True, help_text="app_label.model")
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    changes = models.JSONField(default=dict, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["tenant", "-at"], name="auditevent_tenant_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.action} {self.object_type} {self.object_repr}".strip()
