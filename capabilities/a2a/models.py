"""A remote A2A agent a tenant's agents can call (:class:`A2aAgent`), bound with the ``a2a`` kind."""

from __future__ import annotations

from django.db import models

from tenants.scoping import TenantOwnedModel


class A2aAgent(TenantOwnedModel):
    """A remote agent speaking A2A, known by its agent card's URL.

    The card is fetched when a run opens its tools (and by the admin API's save, to check it),
    through the outbound address rules (:mod:`capabilities.a2a.http`); the URL is checked when
    saved too. ``headers`` (its credentials, e.g. ``Authorization: Bearer …``) are stored
    encrypted with the tenant's data key and never returned by the API; they are sent with the
    card's request and every call.
    """

    name = models.CharField(max_length=100)
    card_url = models.URLField(
        max_length=2000,
        help_text="The agent card's URL, e.g. https://agents.example.com/.well-known/agent-card.json.",
    )
    headers_encrypted = models.TextField(blank=True, editable=False)
    call_timeout_seconds = models.FloatField(
        default=120.0, help_text="Seconds for one call (the agent's tool timeout applies too; the shorter wins).",
    )
    card_snapshot = models.JSONField(
        default=dict, blank=True, editable=False, help_text="The card as last fetched (JSON).",
    )
    last_error = models.TextField(blank=True, editable=False, help_text="The last card fetch's error.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="a2aagent_unique_name")]
        verbose_name = "remote A2A agent"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The card URL passes the outbound address rules (no loopback, private or metadata
        address unless an operator allowed the host: ``OUTBOUND_ALLOWED_HOSTS``/``_CIDRS``)."""
        from django.core.exceptions import ValidationError

        from capabilities.netsafe import FetchError, check_outbound_url

        try:
            check_outbound_url(self.card_url)
        except FetchError as exc:
            raise ValidationError({"card_url": exc.message}) from exc
        if self.call_timeout_seconds is not None and self.call_timeout_seconds <= 0:
            raise ValidationError({"call_timeout_seconds": "A positive number of seconds."})
