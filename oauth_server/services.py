"""Writes of the OAuth grants: :func:`mcp_grant_revoke`, :func:`mcp_grants_of_application_delete`."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from oauth2_provider.models import get_refresh_token_model

from oauth_server.models import McpGrant
from tenants.scoping import system_scope


@transaction.atomic
def mcp_grant_revoke(*, grant: McpGrant) -> None:
    """Revoke ``grant``: its refresh tokens are revoked (their access tokens deleted, DOT's
    ``revoke_family``) and the row deleted, so no token of it authenticates or refreshes again.

    Requires the grant's tenant scope (or a bypass) to delete the row.
    """
    if grant.token_family is not None:
        get_refresh_token_model().revoke_family(grant.token_family)
    grant.delete()


def mcp_grants_of_application_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``pre_delete`` of DOT's Application: its grants go with it (connected in this app's
    ``ready()``; see :attr:`oauth_server.models.McpGrant.application` for why not a cascade)."""
    # tenant-bypass: an application's grants span tenants; the application itself is going.
    with system_scope():
        McpGrant.all_tenants.filter(application_id=instance.pk).delete()
