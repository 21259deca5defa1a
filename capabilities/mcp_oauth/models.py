"""An OAuth connection of a remote MCP server (:class:`McpOAuthConnection`): one per user (the
server's ``auth_mode`` is ``oauth_user``) or one for the whole tenant (``oauth_tenant``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.scoping import TenantOwnedModel


class ConnectionStatus(models.TextChoices):
    PENDING = "pending", "Waiting for the authorization redirect"
    CONNECTED = "connected", "Connected"
    RECONNECT = "reconnect", "Connect again (the refresh failed or the grant was revoked)"


class McpOAuthConnection(TenantOwnedModel):
    """The tokens one person (``user``) or the tenant (``user`` null) holds for one MCP server.

    Secrets (the access and refresh tokens, the PKCE verifier of a pending authorization and the
    client registration) are encrypted with the tenant's data key (:mod:`tenants.crypto`).
    ``expires_at`` is computed from the token response's ``expires_in`` when it arrives and
    stored, so it survives restarts. A refresh happens under this row's lock (``SELECT … FOR
    UPDATE``): however many runs and workers find the token expired at once, one refreshes and
    the others read its result (:func:`capabilities.mcp_oauth.services.connection_access_token`).
    """

    server = models.ForeignKey("capabilities.McpServer", on_delete=models.CASCADE, related_name="oauth_connections")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+",
        help_text="The person whose account this is; empty: the tenant's service account.",
    )
    status = models.CharField(max_length=20, choices=ConnectionStatus.choices, default=ConnectionStatus.PENDING)
    access_token_encrypted = models.TextField(blank=True, editable=False)
    refresh_token_encrypted = models.TextField(blank=True, editable=False)
    token_type = models.CharField(max_length=40, blank=True, default="Bearer")
    scope = models.TextField(blank=True, help_text="The scopes granted (space-separated).")
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="When the access token expires (from expires_in); empty: not said.",
    )
    client_encrypted = models.TextField(
        blank=True, editable=False, help_text="The client registration used (JSON: client_id, secret, auth method).",
    )
    authorization_server = models.JSONField(
        default=dict, blank=True, editable=False,
        help_text="What discovery found: issuer, token/revocation endpoints, resource.",
    )
    requested_scope = models.TextField(
        blank=True, help_text="Scopes the next Connect asks for (a server's step-up: what it said it needs).",
    )
    pending_state_hash = models.CharField(max_length=64, blank=True, db_index=True, editable=False)
    pending_verifier_encrypted = models.TextField(blank=True, editable=False)
    pending_return_to = models.CharField(max_length=500, blank=True, editable=False)
    pending_started_at = models.DateTimeField(null=True, blank=True, editable=False)
    pending_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", editable=False,
        help_text="Who started the pending authorization (only they may complete it).",
    )
    pending_authorization_server = models.JSONField(default=dict, blank=True, editable=False)
    pending_client_encrypted = models.TextField(blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    refresh_count = models.PositiveIntegerField(default=0, editable=False)
    connected_at = models.DateTimeField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["server_id", "user_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["server", "user"], name="mcpoauth_one_per_user", condition=models.Q(user__isnull=False)),
            models.UniqueConstraint(
                fields=["server"], name="mcpoauth_one_per_tenant", condition=models.Q(user__isnull=True)),
        ]
        verbose_name = "MCP OAuth connection"

    def __str__(self) -> str:
        return f"{self.server_id}:{self.user_id or 'tenant'} ({self.status})"
