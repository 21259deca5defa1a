"""DOT's request validator, binding the authorization code and its tokens to one
:class:`~oauth_server.models.McpGrant` (a membership and a resource).

oauthlib calls it: ``save_authorization_code`` when the user consents (the consent view passes
the chosen membership as the credential ``mcp_membership``), ``validate_code`` and
``save_bearer_token`` at the code's exchange (the grant learns its refresh-token family),
``validate_refresh_token`` at a refresh (refused once the grant is gone: revoked, or the
membership deleted).
"""

from __future__ import annotations

import hashlib
from typing import Any

from oauth2_provider.models import get_refresh_token_model
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.oauth2.rfc6749 import errors

from oauth_server.models import McpGrant
from oauth_server.redirects import redirect_uri_problem
from tenants.audit import Action, audit_record
from tenants.scoping import system_scope


def _checksum(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class McpOAuth2Validator(OAuth2Validator):
    """:class:`oauth2_provider.oauth2_validators.OAuth2Validator` plus the membership binding."""

    def validate_redirect_uri(self, client_id: str, redirect_uri: str, request: Any, *args: Any, **kwargs: Any) -> bool:
        """:func:`oauth_server.redirects.redirect_uri_problem` (a client stored before the rule
        may list a URI it refuses), then DOT's exact match against the registered URIs."""
        if redirect_uri_problem(redirect_uri) is not None:
            return False
        return super().validate_redirect_uri(client_id, redirect_uri, request, *args, **kwargs)

    def save_authorization_code(
        self, client_id: str, code: dict[str, Any], request: Any, *args: Any, **kwargs: Any
    ) -> None:
        """Save the code (DOT) and its :class:`McpGrant` (the consent's membership, the resource).

        Raises:
            oauthlib AccessDeniedError: no membership chosen (never from the consent view).
            oauthlib CustomOAuth2Error ``invalid_target``: not exactly one resource (the consent view checked it).
        """
        membership = getattr(request, "mcp_membership", None)
        if membership is None:
            raise errors.AccessDeniedError(description="No tenant was chosen.", request=request)
        resources = list(getattr(request, "resource", None) or [])
        if len(resources) != 1:
            raise errors.CustomOAuth2Error(
                error="invalid_target", request=request, description="Name exactly one MCP endpoint as `resource`."
            )
        super().save_authorization_code(client_id, code, request, *args, **kwargs)
        # tenant-bypass: the membership (the consenting user's own, checked by the view) decides it.
        with system_scope():
            grant = McpGrant.all_tenants.create(
                tenant_id=membership.tenant_id,
                membership=membership,
                application=request.client,
                resource=resources[0],
                scope=" ".join(request.scopes or []),
                code_hash=_checksum(code["code"]),
            )
        application = request.client
        audit_record(
            action=Action.OAUTH_CONSENT_GIVEN,
            obj=grant,
            actor=membership.user,
            detail={
                "client_id": application.client_id,
                "client_name": application.name[:100],
                "resource": grant.resource,
                "scope": grant.scope,
                "redirect_uri": (getattr(request, "redirect_uri", "") or "")[:200],
            },
        )

    def validate_code(self, client_id: str, code: str, client: Any, request: Any, *args: Any, **kwargs: Any) -> bool:
        """DOT's check, and the code must carry an :class:`McpGrant` (remembered on ``request``)."""
        if not super().validate_code(client_id, code, client, request, *args, **kwargs):
            return False
        # tenant-bypass: the code decides the grant.
        with system_scope():
            grant = McpGrant.all_tenants.filter(code_hash=_checksum(code), token_family__isnull=True).only("pk").first()
        if grant is None:
            return False
        request.mcp_grant_id = grant.pk
        return True

    def save_bearer_token(self, token: dict[str, Any], request: Any, *args: Any, **kwargs: Any) -> None:
        """Save the tokens (DOT: a refresh rotates, the old refresh token is revoked); after a
        code's exchange, bind the grant to the new refresh token's family."""
        super().save_bearer_token(token, request, *args, **kwargs)
        grant_id = getattr(request, "mcp_grant_id", None)
        if grant_id is None or not token.get("refresh_token"):
            return
        family = (
            get_refresh_token_model()
            .objects.filter(token_checksum=_checksum(token["refresh_token"]))
            .values_list("token_family", flat=True)
            .first()
        )
        # tenant-bypass: the grant was found by its code.
        with system_scope():
            McpGrant.all_tenants.filter(pk=grant_id).update(token_family=family, code_hash="")

    def validate_refresh_token(self, refresh_token: str, client: Any, request: Any, *args: Any, **kwargs: Any) -> bool:
        """DOT's check, and the token's family must still have its :class:`McpGrant`."""
        if not super().validate_refresh_token(refresh_token, client, request, *args, **kwargs):
            return False
        family = request.refresh_token_instance.token_family
        # tenant-bypass: the refresh token decides the grant.
        with system_scope():
            return family is not None and McpGrant.all_tenants.filter(token_family=family).exists()
