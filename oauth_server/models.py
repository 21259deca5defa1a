"""One consent of a user to an OAuth client: :class:`McpGrant`."""

from __future__ import annotations

from django.db import models
from oauth2_provider.settings import oauth2_settings

from tenants.scoping import TenantOwnedModel


class McpGrant(TenantOwnedModel):
    """A user let an OAuth client (``application``) use ONE MCP endpoint (``resource``) as
    ONE of their memberships (``membership``, chosen on the consent page).

    Created when the user consents (with the authorization code, ``code_hash``); the code's exchange
    binds it to the refresh-token family (``token_family``: every rotation of the refresh
    token keeps it), which is how an access token finds its membership
    (:func:`oauth_server.tokens.oauth_caller`). Deleting the row (the user revokes the grant in
    Settings, or the membership goes: cascade) refuses its tokens at once; revoking also
    revokes the tokens themselves (:func:`oauth_server.services.mcp_grant_revoke`).
    """

    membership = models.ForeignKey("tenants.Membership", on_delete=models.CASCADE, related_name="oauth_grants")
    # No database constraint, no ORM cascade: DOT deletes applications (a client's RFC 7592
    # DELETE, the admin) outside any tenant scope, where row-level security hides these rows from
    # Django's cascade; :func:`oauth_server.services.mcp_grants_of_application_delete` (a
    # pre_delete receiver) deletes them in the system scope instead.
    application = models.ForeignKey(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    resource = models.CharField(
        max_length=500, help_text="The MCP endpoint's identifier (RFC 8707), e.g. https://host/mcp/agents/."
    )
    scope = models.CharField(max_length=200, blank=True)
    code_hash = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="SHA-256 of the authorization code, until it is exchanged."
    )
    token_family = models.UUIDField(
        null=True, blank=True, unique=True, help_text="The refresh-token family the code's exchange started."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.application_id} → {self.resource} as membership {self.membership_id}"
