"""Writes of the OAuth grants: :func:`mcp_grant_revoke`, :func:`mcp_grants_of_application_delete`,
and the periodic clean-up :func:`oauth_cleanup`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from oauth2_provider.models import (
    clear_expired,
    get_access_token_model,
    get_application_model,
    get_grant_model,
    get_refresh_token_model,
)
from oauth2_provider.settings import oauth2_settings

from oauth_server.models import McpGrant
from tenants.audit import Action, audit_record
from tenants.scoping import system_scope


@transaction.atomic
def mcp_grant_revoke(*, grant: McpGrant) -> None:
    """Revoke ``grant``: its refresh tokens are revoked (their access tokens deleted, DOT's
    ``revoke_family``) and the row deleted, so no token of it authenticates or refreshes again.

    Requires the grant's tenant scope (or a bypass) to delete the row.
    """
    if grant.token_family is not None:
        get_refresh_token_model().revoke_family(grant.token_family)
    audit_record(
        action=Action.OAUTH_GRANT_REVOKED,
        obj=grant,
        detail={"client_id": grant.application.client_id, "resource": grant.resource, "scope": grant.scope},
    )
    grant.delete()


def mcp_grants_of_application_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``pre_delete`` of DOT's Application: its grants go with it (connected in this app's
    ``ready()``; see :attr:`oauth_server.models.McpGrant.application` for why not a cascade)."""
    # tenant-bypass: an application's grants span tenants; the application itself is going.
    with system_scope():
        McpGrant.all_tenants.filter(application_id=instance.pk).delete()


def oauth_cleanup(*, now: Any = None) -> dict[str, int]:
    """Delete what the authorization server no longer needs (the beat task ``oauth_server.cleanup``).

    1. DOT's ``clear_expired`` (what ``manage.py cleartokens`` does): expired access tokens,
       refresh tokens past ``REFRESH_TOKEN_EXPIRE_SECONDS`` (revoked ones are kept until then,
       ``REFRESH_TOKEN_REUSE_PROTECTION``), expired authorization codes.
    2. Consents whose code was never exchanged (:class:`McpGrant` without a token family),
       older than the code's life (``AUTHORIZATION_CODE_EXPIRE_SECONDS``): the code is dead, so
       the row can never become a grant.
    3. Grants whose refresh-token family has no refresh token left (all expired and cleared
       in step 1): they authenticate nothing and would stay listed in Settings.
    4. Dynamically registered clients (RFC 7591) older than ``OAUTH_UNUSED_CLIENT_DAYS`` days
       with no token but their registration token, no refresh token and no code: a client
       that registered and never finished a sign-in (their grants go with them,
       :func:`mcp_grants_of_application_delete`).

    Args:
        now: The time to measure ages from (tests); default now.

    Returns:
        Counts deleted: ``{"consents", "grants", "clients"}``; DOT logs its own counts.
    """
    now = now or timezone.now()
    clear_expired()
    code_life = timedelta(seconds=oauth2_settings.AUTHORIZATION_CODE_EXPIRE_SECONDS)
    # tenant-bypass: the clean-up spans every tenant.
    with system_scope():
        consents, _ = McpGrant.all_tenants.filter(token_family__isnull=True, created_at__lt=now - code_life).delete()
        families = get_refresh_token_model().objects.filter(token_family__isnull=False).values("token_family")
        grants, _ = (
            McpGrant.all_tenants.filter(token_family__isnull=False, created_at__lt=now - code_life)
            .exclude(token_family__in=families)
            .delete()
        )
    application_model = get_application_model()
    days = int(getattr(settings, "OAUTH_UNUSED_CLIENT_DAYS", 30))
    tokens = (
        get_access_token_model()
        .objects.filter(application=OuterRef("pk"))
        .exclude(scope=oauth2_settings.DCR_REGISTRATION_SCOPE)
    )
    unused = (
        application_model.objects.filter(
            registration_source=application_model.RegistrationSource.DCR, created__lt=now - timedelta(days=days)
        )
        .exclude(Exists(tokens))
        .exclude(Exists(get_refresh_token_model().objects.filter(application=OuterRef("pk"))))
        .exclude(Exists(get_grant_model().objects.filter(application=OuterRef("pk"))))
    )
    clients = 0
    for application in unused.iterator():
        application.delete()  # its registration token cascades; pre_delete takes its grants
        clients += 1
    return {"consents": consents, "grants": grants, "clients": clients}
